"""gRPC health for kubelet probes and Envoy: one state, served by epp.transport.

Services: "liveness" is SERVING for the whole life of the process (the event
loop answers); "readiness", "" (the server as a whole), the ext_proc service
and "inference-extension" (the service the reference's Helm chart probes
with one replica) turn SERVING once the EPP has its objectives and endpoints
(files loaded, or the cluster synced) and NOT_SERVING when it starts
shutting down. With leader election (`leader_gated`), they are SERVING only
on the holder of the pool's Lease, as in the reference, so that a Service in
front of several replicas sends traffic to the leader only.

`Health.routes()` serves `Check` (one answer; NOT_FOUND for an unknown
service) and `Watch` (the status now, then every change; SERVICE_UNKNOWN
for an unknown service, as grpc-health-checking does). `epp serve` mounts
them on the health port (9003), a server of its own with its own small
limits (epp.transport.HEALTH_LIMITS), so that probes are answered while the
ext_proc port is at its connection cap; the ext_proc port answers them too.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from epp.transport import Call, Route, Status

LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
CHART_PROBE = "inference-extension"
"""The service name the reference chart's probes ask for with one replica
(the reference answers any name then)."""
READY_SERVICES = ("", READINESS, EXT_PROC, CHART_PROBE)
CHECK_METHOD = "/grpc.health.v1.Health/Check"
WATCH_METHOD = "/grpc.health.v1.Health/Watch"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def _answer(status: int) -> bytes:
    return health_pb2.HealthCheckResponse(status=status).SerializeToString()  # type: ignore[arg-type]


class Health:
    """The EPP's health states and the calls watching them; see the module docstring."""

    def __init__(self, leader_gated: bool = False) -> None:
        self.statuses: dict[str, int] = {}
        self.ready = False
        self._closing = False
        self._synced = False
        self._leader_gated = leader_gated
        self._leading = not leader_gated
        self._watches: dict[str, set[HealthWatch]] = {}
        self.on_change: list[Callable[[str, int], None]] = []
        """Told of every status change (service, status): the protocol workers mirror them."""

    async def start(self) -> None:
        self._set(LIVENESS, SERVING)
        for service in READY_SERVICES:
            self._set(service, NOT_SERVING)

    def routes(self) -> dict[str, Route]:
        return {CHECK_METHOD: self.check_route, WATCH_METHOD: self.watch_route}

    def check_route(self, call: Call) -> HealthCheck:
        return HealthCheck(self.statuses, call)

    def watch_route(self, call: Call) -> HealthWatch:
        return HealthWatch(self, call)

    async def set_ready(self) -> None:
        """The inputs are loaded (or synced)."""
        self._synced = True
        await self._publish()

    async def set_leading(self, leading: bool) -> None:
        """This replica gained or lost the pool's Lease (ignored unless leader_gated)."""
        self._leading = leading or not self._leader_gated
        await self._publish()

    async def _publish(self) -> None:
        if self._closing:
            return
        ready = self._synced and self._leading
        if ready == self.ready and self.statuses.get(READINESS) is not None:
            return
        self.ready = ready
        for service in READY_SERVICES:
            self._set(service, SERVING if ready else NOT_SERVING)

    async def shutting_down(self) -> None:
        """Readiness goes NOT_SERVING for good; liveness stays SERVING."""
        self._closing = True
        self.ready = False
        for service in READY_SERVICES:
            self._set(service, NOT_SERVING)

    def mirror(self, service: str, status: int) -> None:
        """Take a status the core owner's `Health` changed (a protocol worker's)."""
        self._set(service, status)

    def _set(self, service: str, status: int) -> None:
        if self.statuses.get(service) == status:
            return
        self.statuses[service] = status
        for listener in self.on_change:
            listener(service, status)
        for watch in list(self._watches.get(service, ())):
            watch.tell(status)

    def _watch(self, service: str, watch: HealthWatch) -> None:
        self._watches.setdefault(service, set()).add(watch)
        watch.tell(self.statuses.get(service, SERVICE_UNKNOWN))

    def _unwatch(self, service: str, watch: HealthWatch) -> None:
        watches = self._watches.get(service)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[service]


class HealthCheck:
    """`Health/Check`: one request, one answer."""

    __slots__ = ("_call", "_service", "_statuses")

    def __init__(self, statuses: dict[str, int], call: Call) -> None:
        self._statuses = statuses
        self._call = call
        self._service: str | None = None

    def on_message(self, payload: bytes) -> None:
        try:
            self._service = health_pb2.HealthCheckRequest.FromString(payload).service
        except DecodeError:
            self._call.finish(Status.INVALID_ARGUMENT, "not a HealthCheckRequest")

    def on_half_close(self) -> None:
        status = self._statuses.get(self._service or "")
        if self._service is None:
            self._call.finish(Status.INVALID_ARGUMENT, "no HealthCheckRequest")
        elif status is None:
            self._call.finish(Status.NOT_FOUND, "unknown service")
        else:
            self._call.send(_answer(status))
            self._call.finish()

    def on_cancel(self) -> None:
        pass


class HealthWatch:
    """`Health/Watch`: the status now, then each change, until the client
    cancels or the server stops."""

    __slots__ = ("_call", "_health", "_service")

    def __init__(self, health: Health, call: Call) -> None:
        self._health = health
        self._call = call
        self._service: str | None = None

    def on_message(self, payload: bytes) -> None:
        if self._service is not None:
            self._call.finish(Status.INVALID_ARGUMENT, "one HealthCheckRequest per Watch")
            self._stop()
            return
        try:
            self._service = health_pb2.HealthCheckRequest.FromString(payload).service
        except DecodeError:
            self._call.finish(Status.INVALID_ARGUMENT, "not a HealthCheckRequest")
            return
        self._health._watch(self._service, self)

    def tell(self, status: int) -> None:
        self._call.send(_answer(status))

    def on_half_close(self) -> None:
        if self._service is None:
            self._call.finish(Status.INVALID_ARGUMENT, "no HealthCheckRequest")

    def on_cancel(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._service is not None:
            self._health._unwatch(self._service, self)
