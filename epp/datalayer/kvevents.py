"""The model servers' KV-cache events over ZMQ, into the core's precise index.

vLLM's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`) sends each
batch on a PUB socket as three frames: the topic (`kv@<pod>@<model>` as
llm-d configures it), the batch's sequence number (8 bytes, big-endian) and
the batch as MessagePack (msgspec): `[ts, [event, ...], dp_rank]` with each
event `["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name, ...]`, `["BlockRemoved",
block_hashes, medium, ...]` or `["AllBlocksCleared"]` (array_like structs
with trailing defaults omitted), or, in newer versions, the same as maps
tagged under `"type"`. A block hash is an int, or the digest's bytes (read
as the last 8 bytes, big-endian, which is the int form). Its ROUTER replay
socket answers a DEALER's `[b"", start_seq]` with `[b"", seq, payload]` for
each batch still buffered from `start_seq` on, then `[b"", -1, b""]`.

`decode_batch` turns a payload into core events: a batch that is no
MessagePack or not a batch raises `KVEventDecodeError`; inside a good batch
a malformed event or one of an unknown type is dropped and counted, so the
rest still applies.

`EndpointSubscriber` reads one endpoint's publisher. Sequence numbers go up
by one per batch: a batch already applied is skipped; a gap is filled from
the replay socket when there is one (else counted and read on); a number
lower than the last live one, or the publisher's connection coming back
after it dropped, means the server may have restarted (a new process counts
from 0 again and has an empty cache), so what the index knew of it is
dropped and rebuilt from the replay socket, if any, and the new batches;
joining mid-stream asks for a replay from 0. `KVEventsSubscribers` keeps one subscriber per endpoint
of the store (its host, the configured port) and, when a `zmqEndpoint` is
configured, one SUB socket bound there that servers connect to, each known
by its topic's pod part. An endpoint that leaves takes its blocks with it.

Bounds: a message is at most `max_message_bytes` (ZMQ drops larger ones),
`hwm` messages wait per socket, a replay runs at most `replay_timeout`
seconds and waits at most `replay_idle` for each reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from epp.config.precise import KVEventsSettings
from epp.datalayer.polling import cancel_and_wait
from epp.scheduling.kvblocks import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MAX_MESSAGE_BYTES = 64 << 20
HWM = 100_000
REPLAY_TIMEOUT = 30.0
REPLAY_IDLE = 2.0

_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")
_STORED_FIELDS += ("medium", "lora_name")
_REMOVED_FIELDS = ("block_hashes", "medium")


class KVEventDecodeError(ValueError):
    """A payload that is no KV-event batch."""


@dataclass(slots=True)
class DecodedBatch:
    ts: float
    events: list[KVEvent]
    dropped: Counter[str] = field(default_factory=Counter)
    """Events dropped, by reason (`malformed`, `unknown-type`)."""


def _hash(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("a block hash is no bool")
    if isinstance(value, int):
        return value & ((1 << 64) - 1)
    if isinstance(value, bytes) and value:
        return int.from_bytes(value[-8:], "big")
    raise ValueError(f"a block hash must be an int or bytes, got {type(value).__name__}")


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ValueError("block_hashes must be a list")
    return tuple(map(_hash, value))


def _fields(raw: Any, names: Sequence[str]) -> tuple[str, list[Any]]:
    """The event's tag and its fields in vLLM's positional order."""
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        values = raw[1:]
        return raw[0], values + [None] * (len(names) - len(values))
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"], [raw.get(name) for name in names]
    raise ValueError("an event is a tagged array or map")


def _tag(raw: Any) -> str | None:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        return raw[0]
    if isinstance(raw, dict) and isinstance(raw.get("type"), str):
        return raw["type"]
    return None


def _optional_str(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"{name} must be a string")


def decode_event(raw: Any) -> KVEvent | None:
    """One decoded event (None for an unknown type); ValueError when malformed."""
    tag = _tag(raw)
    if tag == "BlockStored":
        _, (hashes, parent, tokens, size, _lora_id, medium, lora_name) = _fields(
            raw, _STORED_FIELDS
        )
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ValueError("token_ids must be a list of ints")
        if not isinstance(size, int) or isinstance(size, bool):
            raise ValueError("block_size must be an int")
        return BlockStored(
            _hashes(hashes),
            None if parent is None else _hash(parent),
            tuple(tokens),
            size,
            _optional_str(lora_name, "lora_name"),
            _optional_str(medium, "medium"),
        )
    if tag == "BlockRemoved":
        _, (hashes, medium) = _fields(raw, _REMOVED_FIELDS)
        return BlockRemoved(_hashes(hashes), _optional_str(medium, "medium"))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag is None:
        raise ValueError("an event is a tagged array or map")
    return None


def decode_batch(payload: bytes) -> DecodedBatch:
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as error:
        raise KVEventDecodeError(f"not MessagePack: {error}") from None
    if isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    elif isinstance(raw, dict) and "events" in raw:
        ts, events = raw.get("ts", 0.0), raw["events"]
    else:
        raise KVEventDecodeError("not an event batch: [ts, events, ...] or {ts, events}")
    if not isinstance(events, list):
        raise KVEventDecodeError("the batch's events are not a list")
    batch = DecodedBatch(float(ts) if isinstance(ts, int | float) else 0.0, [])
    for item in events:
        try:
            event = decode_event(item)
        except ValueError:
            batch.dropped["malformed"] += 1
            continue
        if event is None:
            batch.dropped["unknown-type"] += 1
        else:
            batch.events.append(event)
    return batch


def parse_topic(topic: bytes) -> tuple[str, str]:
    """(pod, model) of `kv@<pod>@<model>`; the whole topic and "" otherwise."""
    text = topic.decode("utf-8", "replace")
    parts = text.split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return text, ""


def host_of(address: str) -> str:
    """The host of `host:port` (brackets of an IPv6 literal kept off)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _zmq_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(slots=True)
class KVEventStats:
    """What the subscribers saw (the shell's metrics read it)."""

    messages: Counter[str] = field(default_factory=Counter)
    """Messages received, by endpoint address."""
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(endpoint, operation) -> ZMQ or decode errors."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Events (or whole batches) dropped, by reason."""
    events: Counter[str] = field(default_factory=Counter)
    """Events applied, by type."""
    gaps: int = 0
    replays: Counter[str] = field(default_factory=Counter)
    """Replays by result (`complete`, `failed`)."""
    resets: int = 0
    active: int = 0
    reconnections: Counter[str] = field(default_factory=Counter)
    """Publishers that came back after a disconnection, by endpoint address."""

    def forget(self, address: str) -> None:
        """Drop the per-endpoint series of an endpoint that left."""
        self.messages.pop(address, None)
        self.reconnections.pop(address, None)
        for key in [key for key in self.errors if key[0] == address]:
            del self.errors[key]


Sink = Callable[[str, list[KVEvent]], None]
Reset = Callable[[str], None]


@dataclass(slots=True, eq=False)
class EndpointSubscriber:
    """One endpoint's publisher, read into `sink` in its sequence order (see
    the module docstring). `address` is the endpoint's, as the core knows it."""

    context: zmq.asyncio.Context
    address: str
    publisher: str
    replay: str | None
    topic_filter: str
    sink: Sink
    reset: Reset
    stats: KVEventStats
    max_message_bytes: int = MAX_MESSAGE_BYTES
    replay_timeout: float = REPLAY_TIMEOUT
    replay_idle: float = REPLAY_IDLE
    last_seq: int | None = field(default=None, init=False)
    _last_live: int | None = field(default=None, init=False, repr=False)

    async def run(self) -> None:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, HWM)
        socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic_filter.encode())
        try:
            socket.connect(self.publisher)
        except zmq.ZMQError as error:
            self.stats.errors[(self.address, "connect")] += 1
            log.warning("kv events: cannot connect to %s: %s", self.publisher, error)
            socket.close()
            return
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        disconnected = False
        try:
            if self.replay is not None:
                await self._replay_from(0)
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        disconnected = True
                    elif disconnected:
                        disconnected = False
                        self.stats.reconnections[self.address] += 1
                        await self._reconnected()
                if socket not in ready:
                    continue
                frames = await socket.recv_multipart()
                self.stats.messages[self.address] += 1
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.stats.dropped["malformed-frame"] += 1
                    continue
                await self.live(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            socket.disable_monitor()
            monitor.close()
            socket.close()

    async def _reconnected(self) -> None:
        """The publisher came back: it may be a new process, whose sequence
        starts again and whose cache is empty, so what the index knew of the
        endpoint is dropped and rebuilt from what it can replay."""
        self.stats.resets += 1
        self.reset(self.address)
        self.last_seq = None
        self._last_live = None
        if self.replay is not None:
            await self._replay_from(0)

    async def live(self, seq: int, payload: bytes) -> None:
        """A batch from the live stream."""
        if self._last_live is not None and seq < self._last_live:
            log.info("kv events: %s restarted (sequence %d after %d)", self.address, seq, seq)
            await self._reconnected()
        self._last_live = seq
        last = self.last_seq
        if last is not None and seq <= last:
            return
        if last is not None and seq > last + 1:
            self.stats.gaps += 1
            if self.replay is not None:
                await self._replay_from(last + 1)
                if self.last_seq is not None and seq <= self.last_seq:
                    return
        elif last is None and seq > 0 and self.replay is not None:
            await self._replay_from(0)
            if self.last_seq is not None and seq <= self.last_seq:
                return
        self.apply(seq, payload)

    def apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except KVEventDecodeError as error:
            self.stats.dropped["malformed-batch"] += 1
            log.debug("kv events: %s sent a bad batch %d: %s", self.address, seq, error)
        else:
            self.stats.dropped.update(batch.dropped)
            for event in batch.events:
                self.stats.events[type(event).__name__] += 1
            if batch.events:
                self.sink(self.address, batch.events)
        self.last_seq = seq

    async def _replay_from(self, start: int) -> None:
        """Apply the batches the replay socket still has from `start` on."""
        assert self.replay is not None
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        applied = 0
        try:
            dealer.connect(self.replay)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(self.replay_timeout):
                while True:
                    if not await dealer.poll(self.replay_idle * 1000):
                        raise TimeoutError
                    frames = await dealer.recv_multipart()
                    if frames and not frames[0]:
                        frames = frames[1:]
                    if len(frames) == 3:  # a replay that repeats the topic
                        frames = frames[1:]
                    if len(frames) != 2 or len(frames[0]) != 8:
                        raise ValueError(f"a replay reply of {len(frames)} frames")
                    if frames[0] == END_SEQ or not frames[1]:
                        break
                    seq = int.from_bytes(frames[0], "big")
                    if self.last_seq is None or seq == self.last_seq + 1:
                        self.apply(seq, frames[1])
                        applied += 1
                    elif seq > self.last_seq + 1:
                        raise ValueError(f"replay skipped from {self.last_seq} to {seq}")
        except (TimeoutError, ValueError, zmq.ZMQError) as error:
            self.stats.replays["failed"] += 1
            self.stats.errors[(self.address, "replay")] += 1
            log.info("kv events: replay from %s failed: %s", self.replay, error or "timeout")
        else:
            self.stats.replays["complete"] += 1
            log.debug("kv events: replayed %d batches from %s", applied, self.replay)
        finally:
            dealer.close()


class KVEventsSubscribers:
    """The subscribers for an endpoint store (module docstring); an async
    context manager. `endpoints` gives the current endpoint addresses and
    `on_change` registers the callback for when they change."""

    def __init__(
        self,
        settings: KVEventsSettings,
        endpoints: Callable[[], Iterable[str]],
        sink: Sink,
        reset: Reset,
        stats: KVEventStats | None = None,
    ) -> None:
        self.settings = settings
        self.stats = stats if stats is not None else KVEventStats()
        self._endpoints = endpoints
        self._sink = sink
        self._reset = reset
        self._context = zmq.asyncio.Context()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._central: asyncio.Task[None] | None = None
        self.central_socket: zmq.asyncio.Socket | None = None
        self._running = False

    async def __aenter__(self) -> KVEventsSubscribers:
        self._running = True
        if self.settings.zmq_endpoint:
            socket = self._context.socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, HWM)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            socket.setsockopt(zmq.SUBSCRIBE, self.settings.topic_filter.encode())
            socket.bind(self.settings.zmq_endpoint)
            self.central_socket = socket
            self._central = asyncio.create_task(self._read_central(socket))
        self.sync()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        if self._central is not None:
            tasks.append(self._central)
        await cancel_and_wait(tasks)
        self._tasks.clear()
        self.stats.active = 0
        self._context.destroy(linger=0)

    def sync(self) -> None:
        """Start a subscriber for each new endpoint, stop those of departed
        ones (their blocks leave the index)."""
        if not self._running or not self.settings.discover_pods:
            return
        current = set(self._endpoints())
        for address in list(self._tasks):
            if address not in current:
                self._tasks.pop(address).cancel()
                self._reset(address)
                self.stats.forget(address)
        for address in current - set(self._tasks):
            self._tasks[address] = asyncio.create_task(self._subscriber(address).run())
        self.stats.active = len(self._tasks)

    def _subscriber(self, address: str) -> EndpointSubscriber:
        settings = self.settings
        host = _zmq_host(host_of(address))
        replay = f"tcp://{host}:{settings.replay_port}" if settings.replay_port > 0 else None
        return EndpointSubscriber(
            self._context,
            address,
            f"tcp://{host}:{settings.socket_port}",
            replay,
            settings.topic_filter,
            self._sink,
            self._reset,
            self.stats,
        )

    async def _read_central(self, socket: zmq.asyncio.Socket) -> None:
        """Servers that connect to the bound socket, each by its topic's pod."""
        last: dict[str, int] = {}
        while True:
            frames = await socket.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self.stats.dropped["malformed-frame"] += 1
                continue
            pod, _ = parse_topic(frames[0])
            addresses = [a for a in self._endpoints() if a == pod or host_of(a) == pod]
            if not addresses:
                self.stats.dropped["unknown-pod"] += 1
                continue
            seq = int.from_bytes(frames[1], "big")
            previous = last.get(pod)
            if previous is not None and seq < previous:
                self.stats.resets += 1
                for address in addresses:
                    self._reset(address)
            elif previous is not None and seq > previous + 1:
                self.stats.gaps += 1
            last[pod] = seq
            try:
                batch = decode_batch(frames[2])
            except KVEventDecodeError:
                self.stats.dropped["malformed-batch"] += 1
                continue
            self.stats.dropped.update(batch.dropped)
            for address in addresses:
                self.stats.messages[address] += 1
                if batch.events:
                    self._sink(address, batch.events)
