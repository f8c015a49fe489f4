"""The objectives of one served pool, and a request's priority from its headers.

One registry per pool the EPP serves. It is fed every objective of the pool's
namespace (from files or a watch) and answers with the ones that apply. What a
user can expect:

- An objective applies while its poolRefs name the pool or its poolSelector
  matches the pool's labels; when either side changes (`apply`, `set_pool`)
  so that it no longer matches, it stops applying and its name resolves like
  an unknown one.
- A priority change applies to requests resolved afterwards. A request keeps
  the priority it was resolved with: the registry hands out a number and has
  no handle on the queues.
- Deleting an objective never drops queued requests, for the same reason. The
  published priority set shrinks, and the flow-control core's `ensure_bands`
  only ever adds bands, so the bands of queued requests stay until they drain.

The set of priorities in use (always including 0, the priority of requests
without a known objective) goes to `publish` at construction and whenever it
changes, so that bands exist with their configuration before traffic arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from epp.api.applicability import applies_to
from epp.api.models import InferenceObjective, InferencePool

OBJECTIVE_HEADER = "x-llm-d-inference-objective"
OBJECTIVE_HEADER_ALIAS = "x-gateway-inference-objective"
DEFAULT_PRIORITY = 0


@dataclass(slots=True, frozen=True)
class Resolution:
    """The objective a request names (None when it names none), its priority,
    and whether the name was known to the pool."""

    objective: str | None
    priority: int
    known: bool


def objective_name(headers: Mapping[str, str]) -> str | None:
    """The objective a request names; the canonical header wins over the alias.
    Header names are expected in lower case, as Envoy sends them."""
    return headers.get(OBJECTIVE_HEADER) or headers.get(OBJECTIVE_HEADER_ALIAS) or None


class ObjectiveRegistry:
    """Objectives of `pool`'s namespace, by name; lookups see only those that
    apply to `pool`."""

    __slots__ = (
        "_applicable",
        "_candidates",
        "_pool",
        "_priorities",
        "_publish",
        "unknown_requests",
    )

    def __init__(
        self,
        pool: InferencePool,
        publish: Callable[[Iterable[int]], None] | None = None,
    ) -> None:
        self._pool = pool
        self._publish = publish
        self._candidates: dict[str, InferenceObjective] = {}
        self._applicable: dict[str, InferenceObjective] = {}
        self._priorities: frozenset[int] = frozenset()
        self.unknown_requests = 0
        """Requests that named an objective this pool does not have."""
        self._refresh()

    @property
    def pool(self) -> InferencePool:
        return self._pool

    @property
    def priorities(self) -> frozenset[int]:
        return self._priorities

    def objectives(self) -> list[InferenceObjective]:
        """The objectives that apply to the pool, by name."""
        return [self._applicable[name] for name in sorted(self._applicable)]

    def get(self, name: str) -> InferenceObjective | None:
        return self._applicable.get(name)

    def apply(self, objective: InferenceObjective) -> bool:
        """Add or update an objective; returns whether it applies to the pool.
        Objectives of other namespaces are ignored."""
        if objective.namespace != self._pool.namespace:
            return False
        self._candidates[objective.name] = objective
        self._refresh()
        return objective.name in self._applicable

    def delete(self, name: str) -> bool:
        """Forget an objective; returns whether it was known."""
        known = self._candidates.pop(name, None) is not None
        if known:
            self._refresh()
        return known

    def replace(self, objectives: Iterable[InferenceObjective]) -> None:
        """Make `objectives` the whole set (a re-list, or a reloaded file)."""
        self._candidates = {
            objective.name: objective
            for objective in objectives
            if objective.namespace == self._pool.namespace
        }
        self._refresh()

    def set_pool(self, pool: InferencePool) -> None:
        """The pool changed (for example its labels): re-evaluate every objective."""
        if pool.namespace != self._pool.namespace:
            self._candidates.clear()
        self._pool = pool
        self._refresh()

    def resolve(self, headers: Mapping[str, str]) -> Resolution:
        name = objective_name(headers)
        if name is None:
            return Resolution(None, DEFAULT_PRIORITY, known=False)
        objective = self._applicable.get(name)
        if objective is None:
            self.unknown_requests += 1
            return Resolution(name, DEFAULT_PRIORITY, known=False)
        return Resolution(name, objective.priority, known=True)

    def _refresh(self) -> None:
        self._applicable = {
            name: objective
            for name, objective in self._candidates.items()
            if applies_to(objective, self._pool)
        }
        priorities = frozenset({DEFAULT_PRIORITY, *(o.priority for o in self._applicable.values())})
        if priorities != self._priorities:
            self._priorities = priorities
            if self._publish is not None:
                self._publish(sorted(priorities))
