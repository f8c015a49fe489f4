"""Session affinity: the requests of one session go to the endpoint that
served it before, as the reference EPP's `session-affinity-scorer`,
`session-affinity-filter` and `session-id-producer` do.

Two strategies, as in the reference:

- `encoded_endpoint_header` (stateless, the default): the response carries
  the endpoint in a header (`x-session-token`), base64 of its id
  (`namespace/name`, `Endpoint.id`), and the client sends it back on its
  next request. Tokens are the reference's, so a client written for it (or
  a token it issued) works unchanged.
- `session_id` (stateful): the client sends an opaque id (a header, or an
  attribute a producer published); `SessionBindings` pins each id to the
  endpoint its request went to. An unbound session, or one whose endpoint
  is not among the candidates, expresses no preference; in the second case
  the session moves to wherever its request went.

The scorer rates the session's endpoint 1 and the others 0 (a soft
preference, weighed against the other scorers); the filter keeps only that
endpoint when it is a candidate, else all (a hard pin that never empties
the candidates). An endpoint without an in-flight credit left is still a
candidate of the filter, so a pinned request waits for it; the scorer's
request goes elsewhere, and its session follows. Both learn through
`placed`, which the scheduler calls once a request is placed, with every
profile's endpoint: an instance whose `profile` is set pins that profile's
endpoint (P/D: one instance per stage), else the primary one.

Costs: a decision is O(candidates) (one id comparison each); a binding is
read and refreshed in O(1), and bindings expire exactly `ttl` seconds after
their last use, oldest first, O(1) amortized per request. At most
`max_sessions` are kept: past that the least recently used is dropped
(counted in `dropped`).
"""

from __future__ import annotations

import base64
import binascii
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from epp.scheduling.endpoint import Endpoint
from epp.scheduling.request import InferenceRequest
from epp.scheduling.scorers import StatelessScorer
from epp.scheduling.spec import BuildContext

DEFAULT_TOKEN_HEADER = "x-session-token"
DEFAULT_SESSION_ID_HEADER = "x-session-id"
SESSION_ID_DATA_KEY = "SessionIDDataKey"
"""The data type under which `session-id-producer` publishes (the reference's key)."""
DEFAULT_MAX_SESSIONS = 100_000


def normal_header(name: str, default: str = DEFAULT_TOKEN_HEADER) -> str:
    """A configured header name as request headers are keyed: lower case,
    trimmed; empty means `default`."""
    return name.strip().lower() or default


def encode_token(endpoint: Endpoint) -> str:
    """The session token of `endpoint`: base64 (standard, padded) of its id."""
    return base64.b64encode(endpoint.id.encode()).decode("ascii")


def decode_token(token: str) -> str:
    """The endpoint id in a session token; "" when it is empty or not one."""
    if not token or len(token) % 4:
        return ""
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, ValueError):
        return ""


def attribute_key(data_type: str, producer: str) -> str:
    """The reference's data key, `<data type>/<producer name>`."""
    return f"{data_type}/{producer}"


@dataclass(slots=True, frozen=True)
class SessionSource:
    """Where a session id is read: a request header, or an attribute a
    producer published (exactly one of them)."""

    header: str = ""
    attribute: str = ""
    producer: str = ""

    def read(self, request: InferenceRequest) -> str:
        if self.header:
            return request.headers.get(self.header, "").strip()
        attributes = request.attributes
        if attributes is None:
            return ""
        return attributes.get(attribute_key(self.attribute, self.producer), "").strip()


def session_id(request: InferenceRequest, sources: Sequence[SessionSource]) -> str:
    """The first non-empty id the sources give, or "" (no session)."""
    for source in sources:
        found = source.read(request)
        if found:
            return found
    return ""


class SessionBindings:
    """Session id -> endpoint id, each binding expiring `ttl` seconds after
    its last use, at most `max_sessions` of them (least recently used first
    out). Ordered by last use, so expiry pops from the front."""

    __slots__ = ("_bindings", "_clock", "dropped", "max_sessions", "ttl")

    def __init__(self, ttl: float, max_sessions: int, clock: Callable[[], float]) -> None:
        if ttl <= 0 or max_sessions <= 0:
            raise ValueError(
                f"session bindings need a positive ttl and size: {ttl}, {max_sessions}"
            )
        self.ttl = ttl
        self.max_sessions = max_sessions
        self._clock = clock
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.dropped = 0
        """Bindings dropped because `max_sessions` were held."""

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._bindings)

    def get(self, session: str) -> str:
        """The endpoint id `session` is bound to, or ""."""
        self._expire(self._clock())
        found = self._bindings.get(session)
        return found[0] if found is not None else ""

    def bind(self, session: str, endpoint_id: str) -> None:
        """Bind (or refresh) `session` to `endpoint_id`, used now."""
        now = self._clock()
        self._expire(now)
        bindings = self._bindings
        bindings[session] = (endpoint_id, now)
        bindings.move_to_end(session)
        if len(bindings) > self.max_sessions:
            bindings.popitem(last=False)
            self.dropped += 1

    def _expire(self, now: float) -> None:
        bindings = self._bindings
        oldest = now - self.ttl
        while bindings:
            session, (_, used) = next(iter(bindings.items()))
            if used >= oldest:
                return
            del bindings[session]


class _Affinity:
    """What the session scorer and filter share: which endpoint a request's
    session names among the candidates, and what a placed request teaches."""

    __slots__ = ("_bindings", "_presence", "header", "profile", "sources")

    def __init__(
        self,
        header: str,
        profile: str,
        sources: tuple[SessionSource, ...],
        bindings: SessionBindings | None,
    ) -> None:
        self.header = header
        self.profile = profile
        self.sources = sources
        self._bindings = bindings
        self._presence: tuple[InferenceRequest, bool] | None = None
        """For the request last looked at, whether its session's endpoint was
        a candidate (session_id only): a session moves only when it was not."""

    @property
    def bindings(self) -> SessionBindings | None:
        return self._bindings

    def wanted(self, request: InferenceRequest) -> str:
        """The endpoint id the request's session names, or ""."""
        bindings = self._bindings
        if bindings is None:
            return decode_token(request.headers.get(self.header, ""))
        session = session_id(request, self.sources)
        return bindings.get(session) if session else ""

    def target(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> int:
        """The position of the session's endpoint among `endpoints`, or -1."""
        wanted = self.wanted(request)
        if not wanted:
            return -1
        position = next((i for i, e in enumerate(endpoints) if e.id == wanted), -1)
        if self._bindings is not None:
            self._presence = (request, position >= 0)
        return position

    def placed(
        self, request: InferenceRequest, results: Mapping[str, Endpoint], primary: str
    ) -> None:
        """`request` went to `results` (profile name -> endpoint; `primary`
        names the destination's profile): tell the client (encoded header)
        or bind its session (session_id)."""
        endpoint = results.get(self.profile or primary)
        if endpoint is None:
            return
        bindings = self._bindings
        if bindings is None:
            written = request.response_headers
            if written is None:
                written = request.response_headers = {}
            written[self.header] = encode_token(endpoint)
            return
        session = session_id(request, self.sources)
        if not session:
            return
        bound = bindings.get(session)
        if bound and bound != endpoint.id:
            presence = self._presence
            # Move only on an absence this request's own look-up saw; the
            # picker choosing another candidate does not move a session.
            if presence is None or presence[0] is not request or presence[1]:
                return
        bindings.bind(session, endpoint.id)


class SessionAffinityScorer(_Affinity, StatelessScorer):
    """The session's endpoint scores 1, every other candidate 0. (It learns
    in `placed`, not per profile pick: stateless to the profiles.)"""

    __slots__ = ()

    def score(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        scores = [0.0] * len(endpoints)
        position = self.target(request, endpoints)
        if position >= 0:
            scores[position] = 1.0
        return scores


class SessionAffinityFilter(_Affinity):
    """Only the session's endpoint when it is a candidate, else all."""

    __slots__ = ()

    def filter(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        position = self.target(request, endpoints)
        return endpoints if position < 0 else [endpoints[position]]


class SessionIdProducer:
    """Publishes the session id of a request header or of a cookie as the
    attribute `SessionIDDataKey/<its name>`; nothing when absent."""

    __slots__ = ("cookie", "header", "key")

    def __init__(self, name: str, header: str, cookie: str) -> None:
        self.key = attribute_key(SESSION_ID_DATA_KEY, name)
        self.header = header
        self.cookie = cookie

    def produce(self, request: InferenceRequest) -> None:
        if self.header:
            found = request.headers.get(self.header, "").strip()
        else:
            found = cookie_value(request.headers.get("cookie", ""), self.cookie).strip()
        if not found:
            return
        attributes = request.attributes
        if attributes is None:
            attributes = request.attributes = {}
        attributes[self.key] = found


def cookie_value(header: str, name: str) -> str:
    """The value of cookie `name` in a Cookie header (`a=1; b=2`), or ""."""
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value
    return ""


def bindings_of(plugins: Mapping[str, object]) -> dict[str, SessionBindings]:
    """The session bindings among `plugins` (name -> plugin), by plugin name."""
    found = {}
    for name, plugin in plugins.items():
        if isinstance(plugin, _Affinity) and plugin.bindings is not None:
            found[name] = plugin.bindings
    return found


# -- factories (the registry's session types build through these) --


def session_affinity(
    context: BuildContext,
    kind: type[_Affinity] = SessionAffinityScorer,
    strategy: str = "encoded_endpoint_header",
    header: str = DEFAULT_TOKEN_HEADER,
    profile: str = "",
    sources: tuple[SessionSource, ...] = (SessionSource(DEFAULT_SESSION_ID_HEADER),),
    ttl: float = 300.0,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
) -> _Affinity:
    """The session scorer or filter (`kind`) with the chosen strategy."""
    if strategy == "session_id":
        bindings = SessionBindings(ttl, max_sessions, context.clock)
        return kind(DEFAULT_TOKEN_HEADER, profile, sources, bindings)
    return kind(header, profile, (), None)


def session_id_producer(
    context: BuildContext, name: str = "session-id-producer", header: str = "", cookie: str = ""
) -> SessionIdProducer:
    return SessionIdProducer(name, header, cookie)
