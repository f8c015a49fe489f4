"""Filters: narrow the candidate endpoints before scoring. (The saturation
filter, `unsaturated`, lives with its rule in `epp.scheduling.saturation`.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from epp.flowcontrol.gate import Credits
from epp.scheduling.endpoint import Endpoint
from epp.scheduling.spec import BuildContext


def in_subset(endpoints: Sequence[Endpoint], subset: frozenset[str]) -> list[Endpoint]:
    """Envoy's subset hint: only endpoints whose IP is listed (ports are ignored)."""
    return [endpoint for endpoint in endpoints if endpoint.ip in subset]


def with_room(
    endpoints: Sequence[Endpoint], credits: Credits, priority: int = 0
) -> Sequence[Endpoint]:
    """Only endpoints that still have an in-flight credit for band `priority`."""
    return credits.with_room(endpoints, priority)


def reachable(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Only endpoints whose latest metrics read did not fail: alive, even if
    saturated or not read lately."""
    return [endpoint for endpoint in endpoints if not endpoint.metrics.failing]


ROLE_LABEL = "llm-d.ai/role"
"""The pod label that says which disaggregation stages a pod serves."""

DECODE_ROLES = frozenset({"decode", "prefill-decode", "encode-prefill-decode", "both"})
PREFILL_ROLES = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "encode-prefill-decode", "both"}
)
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


class LabelFilter:
    """Keeps the endpoints whose labels satisfy `keep(labels)`. The answer
    for the latest candidate sequence is kept: candidates are immutable and
    the scheduler passes the same sequence while the pool does not change."""

    __slots__ = ("_candidates", "_kept", "keep")

    def __init__(self, keep: Callable[[Mapping[str, str]], bool]) -> None:
        self.keep = keep
        self._candidates: Sequence[Endpoint] | None = None
        self._kept: Sequence[Endpoint] = ()

    def filter(self, request: object, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if endpoints is not self._candidates:
            keep = self.keep
            kept = [endpoint for endpoint in endpoints if keep(endpoint.labels)]
            self._kept = endpoints if len(kept) == len(endpoints) else kept
            self._candidates = endpoints
        return self._kept


def role_filter(roles: frozenset[str], unlabelled: bool) -> LabelFilter:
    """Keeps endpoints whose `llm-d.ai/role` is one of `roles`; endpoints
    without the label are kept when `unlabelled` (decode), else dropped."""

    def keep(labels: Mapping[str, str]) -> bool:
        role = labels.get(ROLE_LABEL)
        return unlabelled if role is None else role in roles

    return LabelFilter(keep)


def selector_matches(
    labels: Mapping[str, str],
    match_labels: Mapping[str, str],
    expressions: Sequence[tuple[str, str, frozenset[str]]],
) -> bool:
    """A Kubernetes label selector: every label pair and every
    (key, operator, values) requirement must hold."""
    for key, value in match_labels.items():
        if labels.get(key) != value:
            return False
    for key, operator, values in expressions:
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


# -- factories (the registry's filter types build through these) --


def decode_filter(context: BuildContext) -> LabelFilter:
    return role_filter(DECODE_ROLES, unlabelled=True)


def prefill_filter(context: BuildContext) -> LabelFilter:
    return role_filter(PREFILL_ROLES, unlabelled=False)


def encode_filter(context: BuildContext) -> LabelFilter:
    return role_filter(ENCODE_ROLES, unlabelled=False)


def label_selector_filter(
    context: BuildContext,
    match_labels: tuple[tuple[str, str], ...] = (),
    expressions: tuple[tuple[str, str, frozenset[str]], ...] = (),
) -> LabelFilter:
    wanted = dict(match_labels)
    return LabelFilter(lambda labels: selector_matches(labels, wanted, expressions))


def by_label_filter(
    context: BuildContext, label: str, valid_values: frozenset[str], allows_no_label: bool
) -> LabelFilter:
    def keep(labels: Mapping[str, str]) -> bool:
        value = labels.get(label)
        return allows_no_label if value is None else value in valid_values

    return LabelFilter(keep)
