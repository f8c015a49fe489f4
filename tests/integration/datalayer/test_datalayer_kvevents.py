"""KV-cache events over real ZMQ sockets on loopback: a publisher that speaks
as vLLM's, the subscribers that feed the core's precise index."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec
import pytest
import zmq
import zmq.asyncio

from epp.config.precise import KVEventsSettings
from epp.datalayer.kvevents import (
    EndpointSubscriber,
    KVEventDecodeError,
    KVEventsSubscribers,
    KVEventStats,
    decode_batch,
)
from epp.demo.kv_publisher import KVEventPublisher, cleared, encode_batch, removed, stored
from epp.scheduling.kvblocks import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVBlockIndex,
)
from tests.support.waiting import eventually as wait_until

HOST = "127.0.0.1"


@pytest.mark.parametrize("map_encoded", [False, True], ids=["array-like", "map"])
def test_a_vllm_shaped_batch_decodes_into_core_events(map_encoded: bool) -> None:
    payload = encode_batch(
        [
            stored([11, 12], None, list(range(32)), 16, map_encoded),
            removed([12], map_encoded),
            cleared(map_encoded),
        ],
        map_encoded,
    )
    batch = decode_batch(payload)
    assert batch.events == [
        BlockStored((11, 12), None, tuple(range(32)), 16, None, "GPU"),
        BlockRemoved((12,), "GPU"),
        AllBlocksCleared(),
    ]
    assert not batch.dropped


def test_a_block_hash_sent_as_digest_bytes_is_read_as_its_last_eight_bytes() -> None:
    digest = bytes(range(32))
    payload = msgspec.msgpack.encode([1.0, [["BlockRemoved", [digest], "GPU"]]])
    (event,) = decode_batch(payload).events
    assert isinstance(event, BlockRemoved)
    assert event.block_hashes == (int.from_bytes(digest[-8:], "big"),)


def test_malformed_and_unknown_events_are_dropped_and_counted_the_rest_applies() -> None:
    payload = msgspec.msgpack.encode(
        [
            1.0,
            [
                ["BlockStored", "not-a-list", None, [], 16],
                ["SomethingNew", 1, 2],
                42,
                ["BlockRemoved", [7]],
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.events == [BlockRemoved((7,), None)]
    assert batch.dropped == {"malformed": 2, "unknown-type": 1}


@pytest.mark.parametrize("payload", [b"\xc1garbage", msgspec.msgpack.encode({"x": 1})])
def test_a_payload_that_is_no_batch_is_refused(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


class Recorder:
    def __init__(self) -> None:
        self.index = KVBlockIndex()
        self.batches: list[tuple[str, list]] = []
        self.resets: list[str] = []

    def sink(self, address: str, events: list) -> None:
        self.batches.append((address, events))
        self.index.apply(address, events)

    def reset(self, address: str) -> None:
        self.resets.append(address)
        self.index.remove_endpoint(address)


async def subscribe(publisher: KVEventPublisher, recorder: Recorder, stats: KVEventStats):
    context = zmq.asyncio.Context()
    replay = f"tcp://{HOST}:{publisher.replay_port}" if publisher.replay_port else None
    subscriber = EndpointSubscriber(
        context,
        "10.0.0.1:8000",
        f"tcp://{HOST}:{publisher.port}",
        replay,
        "kv@",
        recorder.sink,
        recorder.reset,
        stats,
        replay_idle=0.5,
    )
    task = asyncio.create_task(subscriber.run())
    return context, subscriber, task


async def publish_until(
    publisher: KVEventPublisher, batch: list, done: Callable[[], bool], every: float = 0.02
) -> None:
    """Publish `batch` again until `done()`: a ZMQ subscriber gets nothing
    published before its subscription reaches the publisher."""
    while not done():
        await publisher.publish(batch)
        await asyncio.sleep(every)


async def stop(context: zmq.asyncio.Context, task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    context.destroy(linger=0)


@dataclass(slots=True)
class Subscribed:
    publisher: KVEventPublisher
    subscriber: EndpointSubscriber
    recorder: Recorder
    stats: KVEventStats


@contextlib.asynccontextmanager
async def subscribed(replay: bool = True) -> AsyncIterator[Subscribed]:
    """A publisher (with a replay socket if `replay`) and the subscriber of
    10.0.0.1:8000, once its subscription is live: the first replay done and
    a live batch (block 100) received."""
    recorder, stats = Recorder(), KVEventStats()
    replay_port = 0 if replay else None
    async with KVEventPublisher(HOST, 0, "kv@p@m", replay_port=replay_port) as publisher:
        context, subscriber, task = await subscribe(publisher, recorder, stats)
        if replay:
            await wait_until(lambda: stats.replays["complete"] == 1)
        await publish_until(
            publisher, [stored([100], None, [], 16)], lambda: subscriber.last_seq is not None
        )
        try:
            yield Subscribed(publisher, subscriber, recorder, stats)
        finally:
            await stop(context, task)


async def test_events_published_before_the_subscriber_joined_are_replayed_then_live_ones_follow():
    recorder, stats = Recorder(), KVEventStats()
    async with KVEventPublisher(HOST, 0, "kv@10.0.0.1@m", replay_port=0) as publisher:
        await publisher.publish([stored([1, 2], None, [], 16)])
        context, subscriber, task = await subscribe(publisher, recorder, stats)
        await wait_until(lambda: recorder.index.held_by("10.0.0.1:8000") == 2)
        for key in range(3, 40):
            await publisher.publish([stored([key], key - 1, [], 16)])
        await wait_until(lambda: subscriber.last_seq == publisher.seq - 1, timeout=5)
        assert recorder.index.held_by("10.0.0.1:8000") == 39
        assert stats.replays["complete"] >= 1
        await stop(context, task)


async def test_a_lost_batch_is_fetched_from_the_replay_socket_in_order():
    async with subscribed() as live:
        live.publisher.skip_next = True
        await live.publisher.publish([stored([1], None, [], 16)])
        await live.publisher.publish([removed([1])])
        await wait_until(lambda: live.subscriber.last_seq == live.publisher.seq - 1)
        assert live.stats.gaps == 1
        assert live.stats.replays["complete"] == 2
        # stored, then removed, in order
        assert not live.recorder.index.holds("10.0.0.1:8000", 1)


async def test_a_gap_without_a_replay_socket_is_counted_and_reading_goes_on():
    async with subscribed(replay=False) as live:
        live.publisher.skip_next = True
        await live.publisher.publish([stored([6], None, [], 16)])
        await live.publisher.publish([stored([7], None, [], 16)])
        await wait_until(lambda: live.recorder.index.holds("10.0.0.1:8000", 7))
        assert live.stats.gaps == 1
        assert not live.recorder.index.holds("10.0.0.1:8000", 6)


async def test_a_bad_batch_is_dropped_and_the_next_one_applies():
    async with subscribed() as live:
        await live.publisher.send_raw(b"\xc1 not msgpack")
        await live.publisher.publish([stored([8], None, [], 16), ["Bogus"]])
        await wait_until(lambda: live.recorder.index.holds("10.0.0.1:8000", 8))
        assert live.stats.dropped["malformed-batch"] == 1
        assert live.stats.dropped["unknown-type"] == 1


async def test_a_server_that_restarts_loses_what_it_held_before_its_new_blocks_apply():
    recorder, stats = Recorder(), KVEventStats()
    async with KVEventPublisher(HOST, 0, "kv@p@m", replay_port=0) as first:
        port, replay_port = first.port, first.replay_port
        context, subscriber, task = await subscribe(first, recorder, stats)
        await wait_until(lambda: stats.replays["complete"] == 1)
        await publish_until(
            first, [stored([1, 2, 3], None, [], 16)], lambda: (subscriber.last_seq or 0) >= 3
        )
    async with KVEventPublisher(HOST, port, "kv@p@m", replay_port=replay_port) as second:
        await publish_until(
            second, [stored([9], None, [], 16)], lambda: bool(recorder.resets), every=0.05
        )
        await wait_until(lambda: recorder.index.holds("10.0.0.1:8000", 9))
        assert not recorder.index.holds("10.0.0.1:8000", 1)
        assert stats.resets == 1
        assert stats.reconnections == {"10.0.0.1:8000": 1}
        await stop(context, task)


async def test_the_subscribers_follow_the_endpoints_and_a_departed_ones_blocks_leave():
    recorder = Recorder()
    async with KVEventPublisher(HOST, 0, "kv@127.0.0.1@m", replay_port=0) as publisher:
        await publisher.publish([stored([1, 2], None, [], 16)])
        endpoints = ["127.0.0.1:8000"]
        settings = KVEventsSettings(
            socket_port=publisher.port, replay_port=publisher.replay_port or -1
        )
        async with KVEventsSubscribers(
            settings, lambda: endpoints, recorder.sink, recorder.reset
        ) as subscribers:
            await wait_until(lambda: recorder.index.held_by("127.0.0.1:8000") == 2)
            assert subscribers.stats.active == 1
            endpoints.clear()
            subscribers.sync()
            assert recorder.resets == ["127.0.0.1:8000"]
            assert recorder.index.held_by("127.0.0.1:8000") == 0
            assert subscribers.stats.active == 0


async def test_servers_connecting_to_a_bound_endpoint_are_known_by_their_topic():
    recorder = Recorder()
    context = zmq.asyncio.Context()
    settings = KVEventsSettings(zmq_endpoint=f"tcp://{HOST}:*", discover_pods=False)
    endpoints = ["10.1.1.1:8000", "10.1.1.2:8000"]
    async with KVEventsSubscribers(settings, lambda: endpoints, recorder.sink, recorder.reset) as s:
        assert s.central_socket is not None
        bound = s.central_socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        pub = context.socket(zmq.PUB)
        pub.connect(bound)
        payload = encode_batch([stored([4, 5], None, [], 16)])
        seq = 0
        while not recorder.batches:
            await pub.send_multipart([b"kv@10.1.1.2@m", seq.to_bytes(8, "big"), payload])
            seq += 1
            await asyncio.sleep(0.02)
        await pub.send_multipart([b"kv@10.9.9.9@m", (0).to_bytes(8, "big"), payload])
        await wait_until(lambda: s.stats.dropped["unknown-pod"] == 1)
        assert {address for address, _ in recorder.batches} == {"10.1.1.2:8000"}
        pub.close()
    context.destroy(linger=0)
