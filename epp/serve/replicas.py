"""What replicas of one pool and their decider say to each other
(`epp serve --decider-port` / `--decider`; docs/operations/replicas.md).

A replica is to the decider what a protocol worker is to its core owner
(`epp.serve.wire`): the same messages (ARRIVE, COMPLETE, DECISION, ...),
over a gRPC bidi stream instead of a Unix socket, plus the few below.
One gRPC message is an orjson array `[epoch, messages]`: everything one
side has to say in one turn of its loop. The decider writes its epoch; a
replica writes the highest epoch it has seen, and refuses a frame from an
older one (a deposed decider's late answers).

Clocks. A replica may run on another host, whose monotonic clock has
another origin, so its frames are `[epoch, messages, now]`: its clock when
the frame left. The decider keeps, per stream, the smallest difference
between its own clock at receipt and that stamp (`ClockOffset`: the offset
plus the shortest delay seen, allowed to grow by `DRIFT` per second so the
two clocks' drift is followed), and adds it to each arrival time the
replica sends (ARRIVE, HELD), so FCFS order and TTL deadlines are the
decider's.

Replica -> decider:

    HELLO     the replica's id (its first message on a stream)
    HELD      rid, endpoint, then the request's scheduling inputs
              (`wire.arrival_fields`): a request the replica has running,
              which the decider adopts (a rebuild after a decider change
              or a partition)
    TOLD      epoch, {endpoint: limit}: the learned limits it was last
              told, by the decider of that epoch (on joining, before
              REPORTED): a new decider starts its adaptive gate from them
    REPORTED  every HELD is sent; what the decider kept aside for this
              replica while it was away is released
    SEEN      seq: the replica holds the LIMITS of that sequence number
    BEAT      nothing to say (sent every `BEAT_S`)

Decider -> replica:

    JOINED    the decider decides for this replica from now on; the
              replica reports what it holds (HELD, TOLD, REPORTED) and
              sends its undecided requests again (ARRIVE)
    LIMITS    seq, {endpoint: limit}: the per-endpoint limits that changed
              since the last LIMITS (all of them first); a degraded
              replica's share is cut from the last ones it holds
    BEAT      as above

Shares. A replica away admits within `share` of the limits it last
heard; the decider keeps aside, per endpoint, the share of the largest
limit the replica may hold (`LimitsTold`: what it acknowledged, and what
was sent since), so the two agree though a LIMITS may be lost at the cut.

Silence: the decider counts a replica as away after `AWAY_AFTER_S`
without a frame, and keeps its share of every endpoint aside from then
on; a replica runs degraded only after `DEGRADE_AFTER_S` without one,
later, so its own admissions start after the decider stopped handing its
share out (`epp.serve.decider`, `epp.serve.replica`).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import orjson

from epp.flowcontrol.config import GateConfig, GateKind
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.core import Core
from epp.serve import wire
from epp.serve.wire import MAX_FRAME_BYTES, Message, arrival_fields

SERVICE = "epp.replicas.v1.Decider"
METHOD = f"/{SERVICE}/Link"

HELLO = 21
HELD = 22
REPORTED = 23
BEAT = 24
JOINED = 25
LIMITS = 26
SEEN = 27
TOLD = 28

BEAT_S = 0.1
"""How often each side writes when it has nothing else to say."""
AWAY_AFTER_S = 0.3
"""Silence after which the decider counts a replica as away."""
DEGRADE_AFTER_S = 0.7
"""Silence after which a replica admits on its own (longer than `AWAY_AFTER_S`
plus a beat, so the decider has set the replica's share aside first)."""
RECONNECT_S = 0.2
"""How often a replica without a decider tries to reach it."""
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.max_send_message_length", MAX_FRAME_BYTES),
)
"""Both ends: a frame may carry a request's whole prompt (gRPC's default cap is 4 MiB)."""
MAX_UNSEEN_LIMITS = 64
"""LIMITS a replica may leave unacknowledged; past it its stream ends."""
MAX_QUEUED_FRAMES = 4096
"""Frames a link holds for a peer that does not read; past it the link ends."""


DRIFT = 1e-3
"""How fast a clock offset estimate may grow (s/s): far above two hosts'
monotonic clocks' drift, far below a frame delay's spread."""
ARRIVAL_AT = {wire.ARRIVE: 4, HELD: 5}
"""Where a replica's message holds an arrival time in its own clock."""


@dataclass(slots=True)
class ClockOffset:
    """What to add to a peer's clock to read the decider's (see the module
    docstring); None until the first stamped frame."""

    value: float | None = None
    at: float = 0.0

    def sample(self, now: float, stamp: float) -> None:
        seen = now - stamp
        if self.value is None or seen < self.value + (now - self.at) * DRIFT:
            self.value = seen
        else:
            self.value += (now - self.at) * DRIFT
        self.at = now

    def translate(self, messages: list[Message]) -> None:
        """Each arrival time in `messages` to the decider's clock (in place)."""
        if self.value is None:
            return
        for message in messages:
            index = ARRIVAL_AT.get(message[0])
            if index is not None:
                message[index] += self.value


@dataclass(slots=True)
class LimitsTold:
    """The decider's record of the limits one replica holds: what it
    acknowledged (SEEN, or reported in TOLD), and the LIMITS sent since
    (at most a few beats' worth: each is acknowledged within a round trip)."""

    held: dict[str, int] = field(default_factory=dict)
    sending: list[tuple[int, dict[str, int]]] = field(default_factory=list)

    def changes(self, limits: Mapping[str, int]) -> dict[str, int]:
        """What of `limits` the replica has not been sent yet."""
        latest = dict(self.held)
        for _, sent in self.sending:
            latest.update(sent)
        return {e: limit for e, limit in limits.items() if latest.get(e) != limit}

    def sent(self, seq: int, limits: dict[str, int]) -> None:
        self.sending.append((seq, limits))

    def reported(self, held: dict[str, int], since: int) -> None:
        """The replica reported what it `held` when it joined on a stream
        whose first LIMITS came after `since` (those may be on their way)."""
        self.held = held
        self.sending = [entry for entry in self.sending if entry[0] > since]

    def seen(self, seq: int) -> None:
        while self.sending and self.sending[0][0] <= seq:
            self.held.update(self.sending.pop(0)[1])

    def most(self, endpoint: str) -> int | None:
        """The largest limit of `endpoint` the replica may hold (None: none told)."""
        values = [sent[endpoint] for _, sent in self.sending if endpoint in sent]
        if endpoint in self.held:
            values.append(self.held[endpoint])
        return max(values) if values else None


def share(limit: int, replicas: int) -> int:
    """A replica's part of an endpoint's `limit` when `replicas` share it."""
    return limit // max(1, replicas)


def decode(frame: bytes) -> tuple[int, list[Message], float | None]:
    """A frame's epoch, messages and its sender's clock (None: not stamped);
    ValueError when it is not one."""
    try:
        epoch, messages, *stamp = orjson.loads(frame)
    except (orjson.JSONDecodeError, TypeError, ValueError) as error:
        raise ValueError(f"not a replicas frame: {error}") from None
    if not isinstance(epoch, int) or not isinstance(messages, list) or len(stamp) > 1:
        raise ValueError("not a replicas frame")
    if stamp and not isinstance(stamp[0], int | float):
        raise ValueError("not a replicas frame")
    return epoch, messages, float(stamp[0]) if stamp else None


class StreamLink(wire.TurnOutbox):
    """One side of a replica's stream, with `wire.Link`'s `send`: the
    messages of one loop turn leave as one frame stamped with `epoch()`.
    `frames()` is what the gRPC call writes; `close` ends it."""

    def __init__(self, epoch: Callable[[], int], clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self._epoch = epoch
        self._clock = clock
        """Stamps each frame with this clock when given (a replica's side)."""
        self._frames: asyncio.Queue[bytes | None] = asyncio.Queue()

    def _write(self, outbox: list[Message]) -> None:
        if self._frames.qsize() >= MAX_QUEUED_FRAMES:
            self.close()
            return
        frame = [self._epoch(), outbox] if self._clock is None else [
            self._epoch(), outbox, self._clock()
        ]  # fmt: skip
        self._frames.put_nowait(orjson.dumps(frame))

    async def frames(self) -> AsyncIterator[bytes]:
        while True:
            frame = await self._frames.get()
            if frame is None:
                return
            yield frame

    def close(self) -> None:
        if self.closed:
            return
        self._flush()
        self.closed = True
        self._frames.put_nowait(None)


def held_fields(rid: int, request: FlowRequest) -> Message:
    """HELD for a dispatched request of this replica."""
    return [HELD, rid, request.endpoint, *arrival_fields(request)]


def endpoint_limit(core: Core, gate: GateConfig) -> Callable[[str], int | None]:
    """An endpoint's in-flight limit now, as `core`'s gate holds it: the
    adaptive gate's learned one, else the configured `maxPerEndpoint`
    (None: no per-endpoint limit, so no share to keep)."""
    fixed = (
        gate.max_per_endpoint
        if gate.detector is None
        and gate.max_per_endpoint > 0
        and (GateKind.ADAPTIVE in gate.kinds or GateKind.CONCURRENCY in gate.kinds)
        else None
    )

    def limit_of(address: str) -> int | None:
        learned = core.limits().get(address)
        return learned if learned is not None else fixed

    return limit_of


def advertised_host(bind_address: str) -> str:
    """The host other replicas reach this one's decider port at: `POD_IP`
    (the downward API), else the bind address unless it is a wildcard,
    else the host name's address."""
    found = os.environ.get("POD_IP")
    if found:
        return found
    if bind_address not in ("", "0.0.0.0", "::"):
        return bind_address
    return socket.gethostbyname(socket.gethostname())
