"""Who may read /metrics in cluster mode (`--metrics-endpoint-auth`, on by
default), as controller-runtime's `WithAuthenticationAndAuthorization` filter
decides for the reference EPP:

1. the request's `Authorization: Bearer <token>` goes to the API server as a
   TokenReview; no token, or one it does not accept: 401;
2. the user it names goes back as a SubjectAccessReview for `get` on the
   non-resource URL `/metrics`; not allowed: 403.

Answers are cached per token (allowed for 5 minutes, refused for 30 seconds,
as the filter's authorizer does) in a bounded table, so a Prometheus scraping
every few seconds costs two API calls per token per 5 minutes. An API server
that cannot be asked gives 500 and is not cached.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client import ApiClient, AuthenticationV1Api, AuthorizationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from epp.k8s.calls import call_json

log = logging.getLogger(__name__)

ALLOWED_TTL = 300.0
REFUSED_TTL = 30.0
MAX_CACHED_TOKENS = 1024
"""Distinct tokens remembered at once; the oldest answer goes first."""
OK, UNAUTHORIZED, FORBIDDEN, UNAVAILABLE = 200, 401, 403, 500


class MetricsAuthorizer:
    """`await check(authorization_header, path)` -> 200, 401, 403 or 500."""

    def __init__(
        self,
        api_client: ApiClient,
        clock: Callable[[], float] = time.monotonic,
        max_cached: int = MAX_CACHED_TOKENS,
    ) -> None:
        self._authentication = AuthenticationV1Api(api_client)
        self._authorization = AuthorizationV1Api(api_client)
        self._clock = clock
        self._max_cached = max_cached
        self._cache: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    async def check(self, authorization: str | None, path: str = "/metrics") -> int:
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHORIZED
        now = self._clock()
        cached = self._cache.get((token, path))
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            status = await self._review(token, path)
        except (ApiException, OSError) as error:
            log.warning("cannot review a /metrics token with the API server: %s", error)
            return UNAVAILABLE
        self._remember((token, path), status, now)
        return status

    async def _review(self, token: str, path: str) -> int:
        review = await call_json(
            self._authentication.create_token_review,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return UNAUTHORIZED
        user = status.get("user") or {}
        access = await call_json(
            self._authorization.create_subject_access_review,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": _access_spec(user, path),
            },
        )
        return OK if (access.get("status") or {}).get("allowed") else FORBIDDEN

    def _remember(self, key: tuple[str, str], status: int, now: float) -> None:
        ttl = ALLOWED_TTL if status == OK else REFUSED_TTL
        self._cache[key] = (now + ttl, status)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)


def bearer_token(authorization: str | None) -> str | None:
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _access_spec(user: dict[str, Any], path: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": user.get("username", ""),
        "groups": user.get("groups") or [],
        "nonResourceAttributes": {"path": path, "verb": "get"},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = user["extra"]
    return spec
