"""The memory layout the hot path relies on (CPython): the fields touched per
enqueue and dispatch share one cache line of each request and each flow.
CPython orders a class's own slots by name, so a renamed or added slot can
silently move a hot field to another line; these tests catch that."""

from __future__ import annotations

import ctypes
import sys

from epp.flowcontrol.band import Band
from epp.flowcontrol.config import BandConfig
from epp.flowcontrol.flow import Flow
from epp.flowcontrol.request import FlowRequest

LINE = 64
WORD = 8


def slot_offsets(obj: object) -> dict[str, int]:
    """Byte offset of every slot of `obj` from the start of the object,
    found by storing a distinct sentinel in each slot and reading the
    object's memory back."""
    names = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
    sentinels = {}
    for name in names:
        sentinel = object()
        sentinels[id(sentinel)] = name
        setattr(obj, name, sentinel)
    words = (ctypes.c_uint64 * (sys.getsizeof(obj) // WORD)).from_address(id(obj))
    return {sentinels[word]: index * WORD for index, word in enumerate(words) if word in sentinels}


def new_flow() -> Flow:
    return Flow("tenant", Band(BandConfig(priority=0), 60.0, keep=True, lane=None))


def test_a_requests_queue_and_dispatch_fields_share_its_first_cache_line():
    offsets = slot_offsets(FlowRequest("r", "tenant", 0, 0.0))
    hot = ("next", "prev", "flow", "state", "outcome", "endpoint")
    assert {name: offsets[name] for name in hot if offsets[name] >= LINE} == {}


def test_a_flows_round_robin_fields_share_its_first_cache_line():
    offsets = slot_offsets(new_flow())
    hot = ("head", "tail", "count", "in_flight", "queue", "ring_member")
    assert {name: offsets[name] for name in hot if offsets[name] >= LINE} == {}


def test_requests_and_flows_fill_whole_cache_lines_so_each_starts_on_one():
    for obj in (FlowRequest("r", "tenant", 0, 0.0), new_flow()):
        block = -(-sys.getsizeof(obj) // 16) * 16  # the allocator's 16-byte size classes
        assert block % LINE == 0, type(obj).__name__
