"""Calling kubernetes-asyncio API methods for plain JSON instead of model objects.

Model objects cost time to build for every pod, and their datetime fields
round-trip badly (a Lease's MicroTime must keep six fractional digits), so
the control plane reads and writes dicts."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException


async def call_json(func: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Call `func` and return its decoded JSON body; a non-2xx answer raises
    ApiException with the status, reason and body."""
    response = await func(*args, _preload_content=False, **kwargs)
    body = await response.read()
    if not 200 <= response.status <= 299:
        error = ApiException(status=response.status, reason=response.reason)
        error.body = body.decode(errors="replace")
        raise error
    return json.loads(body)
