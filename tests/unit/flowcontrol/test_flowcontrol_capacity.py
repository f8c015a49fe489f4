"""Capacity: global and per band, in requests and in bytes; 0 is unlimited."""

from __future__ import annotations

from flowcontrol_support import Credits, controller, enqueue_all, request

from epp.flowcontrol.config import BandConfig
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import State


def test_band_request_limit_rejects_the_next_request_at_once():
    core = controller(BandConfig(priority=0, max_requests=2), gate=Credits(0))
    enqueue_all(core, request(), request())
    extra = request()
    assert core.enqueue(extra, 0.0) is Outcome.REJECTED_SATURATED
    assert (extra.state, extra.outcome) == (State.DROPPED, Outcome.REJECTED_SATURATED)
    assert (core.band(0).count, core.queued_requests) == (2, 2)


def test_band_byte_limit_admits_up_to_the_limit_exactly():
    core = controller(BandConfig(priority=0, max_bytes=100), gate=Credits(0))
    enqueue_all(core, request(byte_size=60), request(byte_size=40))
    assert core.enqueue(request(byte_size=1), 0.0) is Outcome.REJECTED_SATURATED
    assert core.enqueue(request(byte_size=0), 0.0) is None
    assert core.band(0).bytes == 100


def test_band_byte_limit_rejects_a_single_request_larger_than_the_band():
    core = controller(BandConfig(priority=0, max_bytes=100), gate=Credits(0))
    assert core.enqueue(request(byte_size=101), 0.0) is Outcome.REJECTED_SATURATED
    assert core.band(0).bytes == 0


def test_band_limits_are_per_band():
    core = controller(BandConfig(priority=0, max_requests=1), gate=Credits(0))
    enqueue_all(core, request(priority=0))
    assert core.enqueue(request(priority=0), 0.0) is Outcome.REJECTED_SATURATED
    assert core.enqueue(request(priority=1), 0.0) is None


def test_global_request_limit_spans_all_bands():
    core = controller(max_requests=2, gate=Credits(0))
    enqueue_all(core, request(priority=0), request(priority=1))
    assert core.enqueue(request(priority=2), 0.0) is Outcome.REJECTED_SATURATED
    assert core.queued_requests == 2


def test_global_byte_limit_spans_all_bands():
    core = controller(max_bytes=10, gate=Credits(0))
    enqueue_all(core, request(priority=0, byte_size=6), request(priority=1, byte_size=4))
    assert core.enqueue(request(priority=2, byte_size=1), 0.0) is Outcome.REJECTED_SATURATED
    assert core.queued_bytes == 10


def test_zero_limits_are_unlimited():
    core = controller(
        BandConfig(priority=0, max_requests=0, max_bytes=0),
        max_requests=0,
        max_bytes=0,
        gate=Credits(0),
    )
    enqueue_all(core, *(request(byte_size=1 << 20) for _ in range(6000)))
    assert (core.queued_requests, core.queued_bytes) == (6000, 6000 << 20)


def test_default_band_limit_is_5000_requests():
    core = controller(gate=Credits(0))
    enqueue_all(core, *(request() for _ in range(5000)))
    assert core.enqueue(request(), 0.0) is Outcome.REJECTED_SATURATED


def test_default_band_limit_is_one_gib():
    core = controller(gate=Credits(0))
    enqueue_all(core, request(byte_size=1 << 30))
    assert core.enqueue(request(byte_size=1), 0.0) is Outcome.REJECTED_SATURATED


def test_dispatch_frees_capacity():
    core = controller(BandConfig(priority=0, max_requests=1), gate=Credits(1))
    enqueue_all(core, request())
    core.dispatch(0.0)
    assert core.enqueue(request(), 0.0) is None


def test_cancel_frees_capacity():
    core = controller(BandConfig(priority=0, max_requests=1, max_bytes=10), gate=Credits(0))
    queued = request(byte_size=10)
    enqueue_all(core, queued)
    core.cancel(queued, 0.0)
    assert core.enqueue(request(byte_size=10), 0.0) is None


def test_rejected_request_is_never_dispatched():
    core = controller(BandConfig(priority=0, max_requests=1), gate=Credits(0))
    enqueue_all(core, request())
    rejected = request()
    core.enqueue(rejected, 0.0)
    core.gate.credits = 10
    assert rejected not in core.dispatch(0.0)
    assert rejected.outcome is Outcome.REJECTED_SATURATED
