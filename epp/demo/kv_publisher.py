"""A KV-cache event publisher that speaks as vLLM's `ZmqEventPublisher`
(`vllm/distributed/kv_events.py`): batches on a PUB socket as
[topic, 8-byte big-endian sequence, msgpack payload], the sequence counting
from 0 per process; the last `buffer_steps` batches kept for a ROUTER replay
socket, which answers [b"", start] with [b"", seq, payload] per buffered
batch from `start` on, then [b"", -1, b""]. The payload is encoded with
msgspec structs shaped as vLLM's: array-like with the type tag first (vLLM
up to its map-encoded release), or maps tagged under "type" (`map_encoded`).

The simulated model servers of the demo publish their cache's stores and
evictions through it; tests use it as a vLLM server's publisher.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from epp.scheduling.kvblocks import HashAlgorithm

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def port_free_on_every(hosts: Sequence[str], attempts: int = 50) -> int:
    """A TCP port free on each of `hosts`: pods on loopback hosts share the one
    `socketPort` a configuration names for their KV-cache events."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no port free on every one of {', '.join(hosts)}")


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[object]
    data_parallel_rank: int | None = None


class _KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None


class BlockRemoved(_KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_KVCacheEvent):
    pass


# The map-encoded release's structs: the same fields, as maps tagged under "type".


class _MapBatch(_EventBatch, array_like=False):
    pass


class MapBlockStored(BlockStored, array_like=False, tag="BlockStored"):
    pass


class MapBlockRemoved(BlockRemoved, array_like=False, tag="BlockRemoved"):
    pass


class MapAllBlocksCleared(AllBlocksCleared, array_like=False, tag="AllBlocksCleared"):
    pass


def stored(
    keys: Sequence[int],
    parent: int | None,
    tokens: Sequence[int],
    block_size: int,
    map_encoded: bool = False,
) -> object:
    make = MapBlockStored if map_encoded else BlockStored
    return make(list(keys), parent, list(tokens), block_size, None, "GPU")


def removed(keys: Sequence[int], map_encoded: bool = False) -> object:
    return (MapBlockRemoved if map_encoded else BlockRemoved)(list(keys), "GPU")


def cleared(map_encoded: bool = False) -> object:
    return MapAllBlocksCleared() if map_encoded else AllBlocksCleared()


def encode_batch(events: Sequence[object], map_encoded: bool = False, ts: float = 0.0) -> bytes:
    batch = (_MapBatch if map_encoded else _EventBatch)(ts or time.time(), list(events), 0)
    return msgspec.msgpack.encode(batch)


def _bind(socket: zmq.asyncio.Socket, host: str, port: int) -> int:
    """Bind `socket` on `host`:`port` (0: any free port); the port bound."""
    socket.bind(f"tcp://{host}:{port or '*'}")
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    assert isinstance(endpoint, bytes)
    return int(endpoint.rsplit(b":", 1)[1])


class KVEventPublisher:
    """An async context manager: binds the PUB (and, with `replay_port`, the
    ROUTER) socket on `host` (port 0: a free one, then in `port` and
    `replay_port`), or with `connect` connects the PUB socket to that
    endpoint (an EPP's bound `kvEventsConfig.zmqEndpoint`, as vLLM's
    publisher does for an endpoint it is not to bind); `publish` sends one batch."""

    def __init__(
        self,
        host: str,
        port: int,
        topic: str,
        replay_port: int | None = None,
        buffer_steps: int = 10_000,
        map_encoded: bool = False,
        connect: str = "",
    ) -> None:
        self.host = host
        self.connect = connect
        self.port = port
        self.replay_port = replay_port
        self.topic = topic.encode()
        self.map_encoded = map_encoded
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._context = zmq.asyncio.Context()
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replays: asyncio.Task[None] | None = None
        self.seq = 0
        self.skip_next = False
        """Tests: number the next batch but do not send it (a lost message)."""
        self.connected = asyncio.Event()
        """Set once the PUB socket has a peer (at once when it binds): a PUB
        drops what it sends before a subscriber's connection is up."""
        self._watch: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KVEventPublisher:
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        if self.connect:
            monitor = self._pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            self._watch = asyncio.create_task(self._await_peer(monitor))
            self._pub.connect(self.connect)
        else:
            self.port = _bind(self._pub, self.host, self.port)
            self.connected.set()
        if self.replay_port is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self.replay_port = _bind(self._router, self.host, self.replay_port)
            self._replays = asyncio.create_task(self._serve_replays(self._router))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in (self._replays, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._context.destroy(linger=0)

    async def _await_peer(self, monitor: zmq.asyncio.Socket) -> None:
        try:
            await monitor.recv_multipart()
            self.connected.set()
        finally:
            monitor.close()

    async def publish(self, events: Sequence[object]) -> int:
        """Send `events` as one batch; its sequence number."""
        assert self._pub is not None
        seq = self.seq
        self.seq += 1
        payload = encode_batch(events, self.map_encoded)
        self._buffer.append((seq, payload))
        if self.skip_next:
            self.skip_next = False
        else:
            await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def send_raw(self, payload: bytes) -> None:
        """Tests: send a payload as the next batch, whatever it holds."""
        assert self._pub is not None
        seq = self.seq
        self.seq += 1
        self._buffer.append((seq, payload))
        await self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    async def _serve_replays(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            await router.send_multipart([client, b"", END_SEQ, b""])


@dataclass(slots=True, frozen=True)
class KVEventsPublishing:
    """How a simulated server publishes its KV-cache events, as vLLM's
    `--kv-events-config` does: on `host` (default: the server's) at `port`
    (0: a free one), its replay socket at `replay_port` (None: none), or
    connected to `connect` (an EPP's bound endpoint) instead; its block keys
    vLLM's for `hash_seed` (PYTHONHASHSEED) and `algorithm`."""

    port: int = 0
    replay_port: int | None = 0
    host: str = ""
    hash_seed: str = ""
    algorithm: HashAlgorithm = HashAlgorithm.SHA256_CBOR
    connect: str = ""
