"""What a process's metric families show, as plain values to compare."""

from __future__ import annotations

from collections.abc import Iterable

from epp.serve.metrics.series import Family


def shown(families: Iterable[Family]) -> dict:
    """(metric name, labels) -> the value (a histogram's: its bucket counts
    and sum, rounded), leaving out series at zero and empty histograms."""
    values = {}
    for family in families:
        for key, value in family.values.items():
            if hasattr(value, "counts"):
                if value.count:
                    values[family.spec.name, key] = (value.counts, round(value.total, 6))
            elif value:
                values[family.spec.name, key] = round(value, 6)
    return values
