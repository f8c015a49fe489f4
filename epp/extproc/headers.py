"""The HTTP headers the EPP reads, writes and strips, and how their values parse.

Names follow the reference EPP (llm-d Router); each canonical name has the
GIE alias where one exists, and the canonical name wins when both are sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.api.registry import OBJECTIVE_HEADER, OBJECTIVE_HEADER_ALIAS
from epp.api.units import parse_duration
from epp.scheduling.profiles import DATA_PARALLEL_HEADER, ENCODERS_HEADER, PREFILLER_HEADER

OBJECTIVE = (OBJECTIVE_HEADER, OBJECTIVE_HEADER_ALIAS)
FAIRNESS_ID = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
MODEL_REWRITE = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")
TTL = ("x-llm-d-inference-ttl",)
TTFT_SLO_MS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")

CONTROL_HEADERS = (*OBJECTIVE, *FAIRNESS_ID, *TTL, *TTFT_SLO_MS)
"""Read by the EPP and removed before the request goes upstream."""

ROUTING_HEADERS = (PREFILLER_HEADER, ENCODERS_HEADER, DATA_PARALLEL_HEADER)
"""What the scheduler tells the model server's sidecar besides the endpoint
(`epp.scheduling.profiles` sets them); a client's own values are removed."""

REQUEST_ID = "x-request-id"
DESTINATION_ENDPOINT = "x-gateway-destination-endpoint"
DESTINATION_SUBSET = "x-gateway-destination-endpoint-subset"
DROPPED_REASON = "x-llm-d-request-dropped-reason"
LB_NAMESPACE = "envoy.lb"
PATH = ":path"
METHOD = ":method"
CONTENT_LENGTH = "content-length"
CONTENT_TYPE = "content-type"
EVENT_STREAM = "text/event-stream"


class BadHeader(ValueError):
    """A control header holds a value the EPP cannot use (HTTP 400)."""


def first(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The value of the first of `names` present (canonical name first)."""
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


def parse_ttl(value: str) -> float:
    """The request's queue TTL in seconds: a Go duration ("30s"), positive."""
    try:
        seconds = parse_duration(value.strip())
    except ValueError:
        raise BadHeader(f'{TTL[0]}: not a duration such as "30s": {value!r}') from None
    if not seconds > 0 or seconds == float("inf"):
        raise BadHeader(f"{TTL[0]}: must be a positive duration, got {value!r}")
    return seconds


def parse_ttft_slo(value: str) -> float:
    """The TTFT target in seconds, from milliseconds; must be positive."""
    try:
        milliseconds = float(value)
    except ValueError:
        raise BadHeader(f"{TTFT_SLO_MS[0]}: not a number of milliseconds: {value!r}") from None
    if not milliseconds > 0 or milliseconds == float("inf"):
        raise BadHeader(f"{TTFT_SLO_MS[0]}: must be positive, got {value!r}")
    return milliseconds / 1000.0
