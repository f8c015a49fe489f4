"""gRPC over HTTP/2 (h2) on the asyncio event loop; see README.md in this folder."""

from epp.transport.calls import Call, Handler, Route
from epp.transport.framing import Status
from epp.transport.limits import HEALTH_LIMITS, TransportLimits
from epp.transport.server import GrpcServer

__all__ = ["HEALTH_LIMITS", "Call", "GrpcServer", "Handler", "Route", "Status", "TransportLimits"]
