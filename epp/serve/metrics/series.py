"""Series kept as plain numbers, written out at scrape time.

A `Family` holds one catalogued metric's series per tuple of its canonical
label values (a histogram's as a `Tally`) and exposes them under the
metric's name and its twin's, the twin summing the canonical series that
share its labels: an update is a dict lookup and an addition, and a twin
costs nothing per request.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from epp.serve.metrics.catalogue import spec
from epp.serve.metrics.spec import Kind, Spec

OTHER = "other"
LABEL_VALUE_LIMIT = 1000


class BoundedLabel:
    """At most `limit` distinct values of a client-chosen label over the life
    of the process; later ones read `other` (empty stays empty). An admitted
    value always reads itself, so paired up/down updates stay balanced."""

    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int = LABEL_VALUE_LIMIT) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if not value or value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


class Tally:
    """A histogram kept as plain counts: `add` costs a bisect and three
    additions; scrapes read it."""

    __slots__ = ("buckets", "count", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.count = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.count += 1
        self.total += value

    def merge(self, other: Tally) -> None:
        self.add_counts(other.counts, other.total)

    def add_counts(self, counts: list[int], total: float) -> None:
        """Another tally's bucket counts and sum, over the same buckets."""
        mine = self.counts
        for index, count in enumerate(counts):
            mine[index] += count
        self.count += sum(counts)
        self.total += total

    def cumulative(self) -> list[tuple[str, int]]:
        result, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += count
            result.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return result


class Family:
    """The series of the catalogued metric `name`, by canonical label values."""

    __slots__ = ("spec", "values")

    def __init__(self, name: str) -> None:
        self.spec: Spec = spec(name)
        self.values: dict[tuple[str, ...], Any] = {}

    def add(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, key: tuple[str, ...], value: float) -> None:
        self.values[key] = value

    def observe(self, key: tuple[str, ...], value: float) -> None:
        self.tally(key).add(value)

    def tally(self, key: tuple[str, ...]) -> Tally:
        found = self.values.get(key)
        if found is None:
            found = self.values[key] = Tally(self.spec.buckets)
        return found

    def remove(self, key: tuple[str, ...]) -> None:
        self.values.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        entry = self.spec
        yield self._family(entry.name, entry.help, entry.labels, self.values)
        if entry.twin is not None:
            yield self._family(
                entry.twin.name, entry.twin_help, entry.twin_labels, self._projected()
            )

    def _projected(self) -> dict[tuple[str, ...], Any]:
        pick = self.spec.pick
        histogram = self.spec.kind is Kind.HISTOGRAM
        merged: dict[tuple[str, ...], Any] = {}
        for key, value in self.values.items():
            twin_key = tuple(key[index] for index in pick)
            if histogram:
                if twin_key not in merged:
                    merged[twin_key] = Tally(self.spec.buckets)
                merged[twin_key].merge(value)
            else:
                merged[twin_key] = merged.get(twin_key, 0.0) + value
        return merged

    def _family(
        self, name: str, documentation: str, labels: tuple[str, ...], values: dict
    ) -> Metric:
        kind = self.spec.kind
        if kind is Kind.HISTOGRAM:
            family: Any = HistogramMetricFamily(name, documentation, labels=labels)
            for key, tally in values.items():
                family.add_metric(list(key), tally.cumulative(), sum_value=tally.total)
            return family
        maker = CounterMetricFamily if kind is Kind.COUNTER else GaugeMetricFamily
        family = maker(name, documentation, labels=labels)
        for key, value in values.items():
            family.add_metric(list(key), value)
        return family


def scraped(name: str, rows: Iterator[tuple[tuple[str, ...], float]] | list) -> Iterator[Metric]:
    """A scrape-time metric from (label values, value) rows: its family and its twin's."""
    family = Family(name)
    for key, value in rows:
        family.set(key, value)
    return family.collect()
