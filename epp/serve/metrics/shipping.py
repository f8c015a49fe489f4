"""Series recorded in one process and shown by another: under `epp serve
--workers N` each protocol worker records the stream side of its requests
(`RequestMetrics.stream_families`: errors, durations, sizes, tokens, TTFT,
TPOT, ITL, response processing, `request_running`) and their outcome series
from the fields each DECISION carries (`RequestMetrics.record_outcome`:
requests, sizes, processing and queue durations, flow-control outcomes,
scheduler attempts, prefix matches), and the core owner's `/metrics` page
shows their sum.

A worker `take`s what its families gathered since its last take (they start
again from nothing); the owner's `Merge` adds each take to its own families.
Every shipped series is a sum of updates (counter increments, histogram
counts, the running gauge's +1 and -1), so adding the takes in any grouping
gives what one process would show. A worker that dies takes its running
requests with it: `forget` removes what it had added to the gauges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from epp.serve.metrics.series import BoundedLabel, Family
from epp.serve.metrics.spec import Kind

Rows = list[list[Any]]
"""`[[metric name, [[label values, value], ...]], ...]`; a histogram's value
is `[bucket counts, sum]`, another's a number."""


def take(families: Iterable[Family]) -> Rows:
    """What `families` gathered since the last take, as rows; each family
    starts again from no series. A series that came back to 0 is shipped
    too (a running gauge up and down again), so the owner shows it as one
    process would."""
    rows: Rows = []
    for family in families:
        values = family.values
        if not values:
            continue
        family.values = {}
        if family.spec.kind is Kind.HISTOGRAM:
            series = [[key, [tally.counts, tally.total]] for key, tally in values.items()]
        else:
            series = [[key, value] for key, value in values.items()]
        rows.append([family.spec.name, series])
    return rows


class Merge:
    """Adds takes from several sources (workers, by index) to `families`.
    `caps` bounds client-chosen labels by name, as this process's own
    updates are bounded; `added` is told of each series a take adds to."""

    __slots__ = ("_added", "_caps", "_families", "_gauges")

    def __init__(
        self,
        families: Iterable[Family],
        caps: Mapping[str, BoundedLabel],
        added: Callable[[Family, tuple[str, ...]], None] | None = None,
    ) -> None:
        self._added = added
        self._families = {family.spec.name: family for family in families}
        self._caps = {
            name: [(i, caps[label]) for i, label in enumerate(family.spec.labels) if label in caps]
            for name, family in self._families.items()
        }
        self._gauges: defaultdict[int, defaultdict[tuple[str, tuple[str, ...]], float]] = (
            defaultdict(lambda: defaultdict(float))
        )
        """Per source, what it added to each gauge series (taken back by `forget`)."""

    def add(self, source: int, rows: Rows) -> None:
        for name, series in rows:
            family = self._families.get(name)
            if family is None:
                continue
            caps = self._caps[name]
            kind = family.spec.kind
            for labels, value in series:
                for index, cap in caps:
                    labels[index] = cap(labels[index])
                key = tuple(labels)
                if kind is Kind.HISTOGRAM:
                    family.tally(key).add_counts(value[0], value[1])
                else:
                    family.add(key, value)
                    if kind is Kind.GAUGE:
                        self._gauges[source][(name, key)] += value
                if self._added is not None:
                    self._added(family, key)

    def forget(self, source: int) -> None:
        """`source` is gone, and what runs through it with it."""
        for (name, key), value in self._gauges.pop(source, {}).items():
            if value:
                self._families[name].add(key, -value)
