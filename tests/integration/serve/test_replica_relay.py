"""A forwarding replica under `--workers` (`epp.serve.replica.Relay`): a
worker's request crosses its core owner to the replica's stream to a
scripted decider (real gRPC on loopback), and the decider's answer comes
back to the worker; what the worker then says reaches the decider."""

from __future__ import annotations

import asyncio
import socket

import pytest

from epp.extproc.server import AdmissionDenied
from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest, State, Usage
from epp.serve import wire
from epp.serve.owner import Owner
from epp.serve.replica import Relay, ReplicaAdmission
from epp.serve.replicas import JOINED
from epp.serve.worker import RemoteAdmission
from tests.integration.serve.test_replica_link import ENDPOINT, ScriptedDecider, free_port
from tests.integration.serve.test_workers_link import make_core, make_request, priority_of
from tests.support.waiting import eventually

pytestmark = pytest.mark.asyncio


async def relayed(port: int) -> tuple[RemoteAdmission, ReplicaAdmission, Owner]:
    """A worker, its owner and the replica the owner relays to, joined."""
    owner = Owner(1, spec=None, priority_of=priority_of)  # type: ignore[arg-type]
    replica = ReplicaAdmission("r1", f"127.0.0.1:{port}", 3, lambda: [ENDPOINT], lambda _: 3)
    owner.admission = Relay(replica, make_core(lambda: 5.0), owner)
    owner_end, worker_end = socket.socketpair()
    await owner.attach(owner.slots[0], owner_end)
    worker = RemoteAdmission()
    worker.link = wire.Link(worker.on_messages, worker.on_lost)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: worker.link, worker_end)
    replica.start()
    return worker, replica, owner


async def joined() -> tuple[ScriptedDecider, RemoteAdmission, ReplicaAdmission]:
    """A scripted decider, and a worker whose owner's replica it joined."""
    decider = ScriptedDecider()
    port = free_port()
    await decider.start(port)
    worker, replica, _ = await relayed(port)
    decider.say(1, [JOINED])
    await eventually(lambda: replica.joined)
    return decider, worker, replica


async def offered(decider: ScriptedDecider, worker: RemoteAdmission, request: FlowRequest) -> int:
    """`request` offered at `worker`; the rid it arrived at the decider with."""
    worker.offer(request)

    def rid() -> int | None:
        return next(
            (m[1] for m in decider.received if m[0] == wire.ARRIVE and m[2] == request.request_id),
            None,
        )

    await eventually(lambda: rid() is not None)
    return rid()  # type: ignore[return-value]


async def test_a_workers_request_is_decided_by_the_decider_and_completes_there() -> None:
    decider, worker, replica = await joined()
    request = make_request(1, "a", "", "prompt", 5.0)
    rid = await offered(decider, worker, request)
    dispatched = [Outcome.DISPATCHED.value, ENDPOINT, ENDPOINT, (), None, None, 0, None]
    decider.say(1, [wire.DECISION, rid, *dispatched])
    assert await asyncio.wait_for(worker.wait(request), 2.0) is Outcome.DISPATCHED
    assert request.endpoint == ENDPOINT
    worker.complete(request, Usage(10, 5))
    await eventually(lambda: [wire.COMPLETE, rid, 10, 5, None] in decider.received)
    await replica.stop()
    await decider.server.stop(0)  # type: ignore[union-attr]


async def test_a_request_the_decider_denies_is_denied_at_its_worker_and_forgotten() -> None:
    decider, worker, replica = await joined()
    request = make_request(1, "a", "", "prompt", 5.0)
    rid = await offered(decider, worker, request)
    decider.say(1, [wire.DENIED, rid, "admitter said no", 0])
    with pytest.raises(AdmissionDenied, match="admitter said no"):
        await asyncio.wait_for(worker.wait(request), 2.0)
    assert request.state is State.DROPPED
    await eventually(lambda: [wire.REJECTED, rid] in decider.received)
    assert replica.pending == 0
    await replica.stop()
    await decider.server.stop(0)  # type: ignore[union-attr]
