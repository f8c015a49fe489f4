"""`LimitsTold`: the decider's record of the learned limits a replica
holds, from which it keeps that replica's share aside while it is away
(`epp.serve.replicas`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from epp.serve.replicas import LimitsTold

ENDPOINTS = ("a", "b")


@st.composite
def conversations(draw: st.DrawFn) -> tuple[LimitsTold, dict[str, int]]:
    """The decider tells a replica changing limits over a stream that is
    cut at some point: the replica holds what reached it before the cut,
    in order, and acknowledged some of it (an acknowledgement may be lost
    too). Returns the decider's record and what the replica holds."""
    told = LimitsTold()
    held: dict[str, int] = {}
    delivered: list[tuple[int, dict[str, int]]] = []
    cut = False
    for seq in range(1, draw(st.integers(1, 12)) + 1):
        limits = {e: draw(st.integers(1, 64)) for e in ENDPOINTS}
        changed = told.changes(limits)
        if not changed:
            continue
        told.sent(seq, changed)
        cut = cut or draw(st.booleans())
        if not cut:
            delivered.append((seq, changed))
            held.update(changed)
        if delivered and draw(st.booleans()):
            told.seen(delivered[draw(st.integers(0, len(delivered) - 1))][0])
    return told, held


@given(conversations())
def test_the_decider_never_counts_a_replica_below_a_limit_it_may_hold(conversation) -> None:
    told, held = conversation
    for endpoint, limit in held.items():
        most = told.most(endpoint)
        assert most is not None and most >= limit


def test_what_was_sent_is_not_sent_again() -> None:
    told = LimitsTold()
    told.sent(1, {"a": 8, "b": 4})
    assert told.changes({"a": 8, "b": 5}) == {"b": 5}


def test_an_acknowledged_limit_replaces_the_ones_before() -> None:
    told = LimitsTold({"a": 16})
    told.sent(1, {"a": 8})
    assert told.most("a") == 16
    told.seen(1)
    assert told.most("a") == 8 and told.sending == []


def test_a_report_on_joining_replaces_what_an_earlier_stream_left_unacknowledged() -> None:
    told = LimitsTold({"a": 16})
    told.sent(1, {"a": 32})  # lost with the old stream, or not
    told.sent(2, {"a": 8})  # on the new stream, after its report
    told.reported({"a": 12}, since=1)
    assert told.held == {"a": 12} and told.most("a") == 12
    assert told.most("b") is None
