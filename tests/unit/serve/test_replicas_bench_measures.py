"""`bench.replicas`'s and `bench.soft_state`'s measures, on made-up records."""

from bench.replicas import vtc_gap
from bench.soft_state import settled_at

SIZES = {"big": (1000, 0), "small": (100, 0)}


def records_and_sent() -> tuple[list[dict], list]:
    """Both tenants backlogged from 0 to 4 s (all sent at 0); one request
    each starts every second: `big`'s charge 1000, `small`'s 100, so the
    gap grows 900 a second (the last start, at 4 s, ends the backlog)."""
    records, sent = [], []
    for second in range(5):
        for tenant in SIZES:
            name = f"{tenant}.{second}"
            records.append({"prompt": name, "at": second + 0.01, "ended": second + 0.5})
            sent.append((name, tenant, 0.0))
    return records, sent


def test_the_vtc_gap_counts_only_the_samples_of_its_window():
    records, sent = records_and_sent()
    assert vtc_gap(records, sent, SIZES) == 3600
    assert vtc_gap(records, sent, SIZES, until=1.5) == 1800
    assert vtc_gap(records, sent, SIZES, since=1.5) == 1800


def test_limits_settle_at_the_first_sample_from_which_they_stay_within_ten_percent():
    limits = [(0.0, {}), (1.0, {"a": 4.0}), (2.0, {"a": 15.0}), (3.0, {"a": 13.0}),
              (4.0, {"a": 15.0}), (5.0, {"a": 16.0})]  # fmt: skip
    assert settled_at(limits, 0.5) == 4.0  # 15 and 16 are within 10% of 16, 13 is not
    assert settled_at(limits, 4.5) == 5.0
    assert settled_at(limits, 0.5, {"a": 4.0}) is None  # never back at 4
