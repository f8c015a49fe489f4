"""`ClockOffset`: a replica's clock read as the decider's, from the stamps
on its frames (`epp.serve.replicas`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epp.serve import wire
from epp.serve.replicas import DRIFT, HELD, ClockOffset


def arrive(arrival: float) -> wire.Message:
    return [wire.ARRIVE, 7, "req-1", "tenant", arrival]


def test_an_arrival_is_moved_to_the_deciders_clock() -> None:
    offset = ClockOffset()
    offset.sample(now=100.0, stamp=5_000.0)
    messages = [arrive(4_999.5), [HELD, 8, "10.0.0.1:8000", "req-2", "tenant", 4_998.0]]
    offset.translate(messages)
    assert messages[0][4] == 99.5
    assert messages[1][5] == 98.0


def test_nothing_is_moved_before_the_first_stamp() -> None:
    messages = [arrive(4_999.5)]
    ClockOffset().translate(messages)
    assert messages[0][4] == 4_999.5


@given(
    true_offset=st.floats(-1e9, 1e9),
    frames=st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 0.5)), min_size=1, max_size=30),
)
def test_the_estimate_is_the_offset_plus_at_most_the_shortest_delay_and_the_drift_allowed(
    true_offset: float, frames: list[tuple[float, float]]
) -> None:
    offset = ClockOffset()
    sent = 0.0
    for gap, delay in frames:
        sent += gap
        offset.sample(now=sent + true_offset + delay, stamp=sent)
    assert offset.value is not None
    elapsed = sum(gap for gap, _ in frames) + max(delay for _, delay in frames)
    slack = 1e-6 * max(1.0, abs(true_offset))
    assert offset.value >= true_offset - slack
    assert offset.value <= true_offset + min(d for _, d in frames) + DRIFT * elapsed + slack
