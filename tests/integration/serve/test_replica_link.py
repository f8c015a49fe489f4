"""A forwarding replica's `ReplicaAdmission` against a scripted decider
over real gRPC on loopback: what it refuses, what it admits on its own
while no decider answers, and what it reports when one joins it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import grpc
import orjson
import pytest

from epp.flowcontrol.config import FlowControlConfig
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.scheduling.request import InferenceRequest
from epp.serve import wire
from epp.serve.inputs import StartupError
from epp.serve.replica import ReplicaAdmission
from epp.serve.replicas import (
    DEGRADE_AFTER_S,
    HELD,
    HELLO,
    JOINED,
    LIMITS,
    REPORTED,
    SEEN,
    SERVICE,
    TOLD,
    decode,
)
from epp.serve.server import EppServer
from tests.support.serving import loopback_options
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio

ENDPOINT = "10.0.0.1:8000"
PAYLOAD = InferenceRequest(model="m", target_model="m", prompt="p")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ScriptedDecider:
    """A decider that records what the replica sends and writes what the
    test tells it (`say(epoch, messages)`)."""

    def __init__(self) -> None:
        self.received: list[wire.Message] = []
        self._out: asyncio.Queue[bytes] = asyncio.Queue()
        self.server: grpc.aio.Server | None = None

    def say(self, epoch: int, *messages: wire.Message) -> None:
        self._out.put_nowait(orjson.dumps([epoch, list(messages)]))

    async def _link(self, frames: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async def read() -> None:
            async for frame in frames:
                self.received.extend(decode(frame)[1])

        reader = asyncio.ensure_future(read())
        try:
            while True:
                yield await self._out.get()
        finally:
            reader.cancel()

    async def start(self, port: int) -> None:
        server = self.server = grpc.aio.server()
        handler = grpc.stream_stream_rpc_method_handler(self._link)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"Link": handler}),)
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()

    def kinds(self) -> list[int]:
        return [message[0] for message in self.received]


@contextlib.asynccontextmanager
async def replica_of(port: int) -> AsyncIterator[ReplicaAdmission]:
    # limit 3 over 3 replicas: a share of 1 on the one endpoint
    replica = ReplicaAdmission("r1", f"127.0.0.1:{port}", 3, lambda: [ENDPOINT], lambda _: 3)
    replica.start()
    try:
        yield replica
    finally:
        await replica.stop()


def request(number: int, priority: int = 0) -> FlowRequest:
    return FlowRequest(
        f"req-{number}",
        "tenant",
        priority,
        float(number),
        payload=InferenceRequest(model="m", target_model="m", prompt=f"prompt {number}"),
    )


async def test_a_replica_refuses_a_decision_from_an_older_epoch_than_it_has_seen() -> None:
    decider = ScriptedDecider()
    port = free_port()
    await decider.start(port)
    async with replica_of(port) as replica:
        decider.say(10, [JOINED])
        await eventually(lambda: replica.joined)
        waiting = request(1)
        assert replica.offer(waiting) is None
        await eventually(lambda: wire.ARRIVE in decider.kinds())
        rid = next(m[1] for m in decider.received if m[0] == wire.ARRIVE)
        dispatched = [Outcome.DISPATCHED.value, ENDPOINT, None, (), None, None, 1, None]
        decider.say(9, [wire.DECISION, rid, *dispatched])
        await eventually(lambda: replica.frames_refused == 1)
        assert waiting.outcome is None
        assert replica.epoch == 10
    await decider.server.stop(0)


async def test_a_replica_without_a_decider_admits_only_within_its_share() -> None:
    async with replica_of(free_port()) as replica:
        await asyncio.sleep(DEGRADE_AFTER_S + 0.2)
        assert replica.degraded
        first, second = request(1), request(2)
        assert replica.offer(first) is Outcome.DISPATCHED
        assert first.endpoint == ENDPOINT
        assert replica.offer(second) is None
        replica.complete(first)
        assert second.outcome is Outcome.DISPATCHED


async def test_a_degraded_replica_cuts_its_share_from_the_limit_the_decider_last_told_it() -> None:
    port = free_port()
    decider = ScriptedDecider()
    await decider.start(port)
    async with replica_of(port) as replica:  # its own limit: 3, a share of 1
        decider.say(1, [JOINED], [LIMITS, 1, {ENDPOINT: 9}])
        await eventually(lambda: SEEN in decider.kinds())
        assert [m[1] for m in decider.received if m[0] == SEEN] == [1]
        await decider.server.stop(0)
        await eventually(lambda: replica.degraded, DEGRADE_AFTER_S + 1.0)
        requests = [request(n) for n in range(4)]
        outcomes = [replica.offer(r) for r in requests]
        assert outcomes == [Outcome.DISPATCHED] * 3 + [None]  # 9 // 3 replicas


async def test_a_joining_replica_reports_what_runs_before_it_resends_what_waits() -> None:
    port = free_port()
    async with replica_of(port) as replica:
        await eventually(lambda: replica.degraded, DEGRADE_AFTER_S + 1.0)
        running, waiting = request(1), request(2)
        replica.offer(running)
        replica.offer(waiting)
        decider = ScriptedDecider()
        await decider.start(port)
        await eventually(lambda: HELLO in decider.kinds(), 3.0)
        decider.say(1, [JOINED])
        await eventually(lambda: wire.ARRIVE in decider.kinds())
        assert decider.kinds() == [HELLO, HELD, TOLD, REPORTED, wire.ARRIVE]
        held, arrive = decider.received[1], decider.received[4]
        assert held[2] == ENDPOINT and held[3] == "req-1"
        assert arrive[2] == "req-2"
        assert not replica.degraded
        assert running.state is State.DISPATCHED and waiting.outcome is None
        await decider.server.stop(0)


async def test_a_decider_port_in_use_is_a_startup_error_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = EppServer(loopback_options(endpoints="127.0.0.1:1", decider_port=port))
        try:
            with pytest.raises(StartupError, match=f"--decider-port {port}: cannot listen"):
                await server.start()
        finally:
            server.hurry()
            await server.stop()


SKEW_S = 1e6
"""A replica host's monotonic clock ahead of the decider's (another boot time)."""


def gate_config(*gate: str) -> str:
    """An EndpointPickerConfig whose flow-control gate is the lines `gate`."""
    lines = "".join(f"    {line}\n" for line in gate)
    return f"apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\nflowControl:\n  gate:\n{lines}"


TWO_PER_ENDPOINT = gate_config("kinds: [concurrency]", "maxPerEndpoint: 2")


async def test_a_decider_reads_a_replicas_arrival_times_in_its_own_clock() -> None:
    decider = EppServer(
        loopback_options(
            endpoints=ENDPOINT, decider_port=0, replicas=2, config_text=TWO_PER_ENDPOINT
        )
    )
    await decider.start()

    def skewed() -> float:
        return time.monotonic() + SKEW_S

    replica = ReplicaAdmission(
        "r1", f"127.0.0.1:{decider.ports['decider']}", 2, lambda: [ENDPOINT], lambda _: 2,
        clock=skewed,
    )  # fmt: skip
    replica.start()
    try:
        await eventually(lambda: replica.joined, 5.0)
        running = [request(n) for n in (1, 2)]
        for held in running:
            held.arrival = skewed()
            assert replica.offer(held) is None
            assert await asyncio.wait_for(replica.wait(held), 5) is Outcome.DISPATCHED
        late = request(3)
        late.arrival, late.ttl = skewed(), 0.3
        assert replica.offer(late) is None
        # its deadline is 0.3 s after it arrived, in the decider's clock too
        outcome = await asyncio.wait_for(replica.wait(late), 3)
        assert outcome is Outcome.REJECTED_TTL_EXPIRED
    finally:
        await replica.stop()
        decider.hurry()
        await decider.stop()


ADAPTIVE = gate_config("kinds: [adaptive]")


@contextlib.asynccontextmanager
async def told_by(epochs_before: int, replicas: int) -> AsyncIterator[EppServer]:
    """An adaptive decider of `replicas` and one replica joined to it that
    was told a limit of 12 by the decider `epochs_before` this one."""
    decider = EppServer(
        loopback_options(
            endpoints=ENDPOINT, decider_port=0, replicas=replicas, config_text=ADAPTIVE
        )
    )
    await decider.start()
    assert decider.decider is not None
    replica = ReplicaAdmission(
        "r1", f"127.0.0.1:{decider.ports['decider']}", replicas, lambda: [ENDPOINT],
        lambda _: None,
    )  # fmt: skip
    replica.told, replica.told_epoch = {ENDPOINT: 12}, decider.decider.epoch - epochs_before
    try:
        assert decider.core.limits().get(ENDPOINT, 4) == 4  # the adaptive gate's initial
        replica.start()
        await eventually(lambda: replica.joined and decider.decider.has_reported("r1"), 5.0)
        yield decider
    finally:
        await replica.stop()
        decider.hurry()
        await decider.stop()


async def test_a_new_decider_starts_from_the_limits_its_predecessor_told_the_replicas() -> None:
    # three replicas: two unreported shares kept aside at the start, one of
    # them this replica's, released when it reports
    async with told_by(1, replicas=3) as decider:
        assert decider.core.limits()[ENDPOINT] == 12
        # the other unreported replica's share is cut from the same limit: 12 // 3
        assert decider.core.in_flight == 4


async def test_a_decider_does_not_start_from_limits_it_told_itself() -> None:
    async with told_by(0, replicas=2) as decider:
        assert decider.decider is not None and not decider.decider.seeded
        assert decider.core.limits().get(ENDPOINT, 4) != 12


def vtc_replica(port: int, limit: int = 3) -> ReplicaAdmission:
    """A replica of 3 on the one endpoint, its bands VTC (1 x input, 2 x output tokens)."""
    config = FlowControlConfig()  # every band VTC
    replica = ReplicaAdmission(
        "r1", f"127.0.0.1:{port}", 3, lambda: [ENDPOINT], lambda _: limit,
        flow_control=lambda: config,
    )  # fmt: skip
    replica.start()
    return replica


def tenant_request(number: int, tenant: str, tokens: int) -> FlowRequest:
    return FlowRequest(
        f"req-{number}", tenant, 0, float(number), input_tokens=tokens, payload=PAYLOAD
    )


async def test_a_degraded_replica_admits_the_flow_charged_fewest_tokens_first_under_vtc() -> None:
    replica = vtc_replica(free_port())
    try:
        await asyncio.sleep(DEGRADE_AFTER_S + 0.2)
        assert replica.degraded
        big, big_again, small = (
            tenant_request(n, tenant, tokens)
            for n, tenant, tokens in ((1, "big", 2000), (2, "big", 2000), (3, "small", 100))
        )
        assert replica.offer(big) is Outcome.DISPATCHED  # the share of 1
        assert replica.offer(big_again) is None and replica.offer(small) is None
        replica.complete(big, Usage(2000, 300))
        assert small.outcome is Outcome.DISPATCHED  # before the older request of `big`
        assert big_again.outcome is None
    finally:
        await replica.stop()


async def test_a_degraded_replica_goes_on_from_what_each_flow_sent_through_it_joined() -> None:
    port = free_port()
    decider = ScriptedDecider()
    await decider.start(port)
    replica = vtc_replica(port, limit=6)  # a share of 2
    try:
        decider.say(1, [JOINED])
        await eventually(lambda: replica.joined)
        running = tenant_request(1, "big", 2000)
        replica.offer(running)
        await eventually(lambda: wire.ARRIVE in decider.kinds())
        rid = next(m[1] for m in decider.received if m[0] == wire.ARRIVE)
        decider.say(
            1,
            [wire.DECISION, rid, Outcome.DISPATCHED.value, ENDPOINT, None, (), None, None, 0, None],
        )
        await eventually(lambda: running.state is State.DISPATCHED)
        big, small = tenant_request(2, "big", 2000), tenant_request(3, "small", 100)
        assert replica.offer(big) is None and replica.offer(small) is None
        await decider.server.stop(0)
        await eventually(lambda: replica.degraded, DEGRADE_AFTER_S + 1.0)
        assert small.outcome is Outcome.DISPATCHED  # room for one: `big` is charged 2000 already
        assert big.outcome is None
    finally:
        await replica.stop()


async def test_a_joining_replica_resends_what_waits_least_served_flow_first() -> None:
    port = free_port()
    replica = vtc_replica(port)
    try:
        await eventually(lambda: replica.degraded, DEGRADE_AFTER_S + 1.0)
        assert replica.offer(tenant_request(1, "big", 2000)) is Outcome.DISPATCHED  # charged
        assert replica.offer(tenant_request(2, "big", 2000)) is None
        assert replica.offer(tenant_request(3, "small", 100)) is None
        decider = ScriptedDecider()
        await decider.start(port)
        await eventually(lambda: HELLO in decider.kinds(), 3.0)
        decider.say(1, [JOINED])
        await eventually(lambda: decider.kinds().count(wire.ARRIVE) == 2)
        resent = [m[2] for m in decider.received if m[0] == wire.ARRIVE]
        assert resent == ["req-3", "req-2"]  # a new decider's level counters take them in turn
        await decider.server.stop(0)
    finally:
        await replica.stop()
