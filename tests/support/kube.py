"""An in-process Kubernetes API server for tests, with fault injection.

Why not kmock: kmock 0.8 keeps no resourceVersions, replays every object as
ADDED on each watch (so a resumed watch sees stale state), filters neither
labels nor fields, knows no 410, bookmarks, status subresource, optimistic
concurrency (a Lease replaced with a stale resourceVersion must fail with 409,
or leader election cannot be tested) nor multi-version serving with pruning.
Wrapping it would replace every handler it has, so this is a small aiohttp
server of its own that implements just what the EPP's control plane uses:

- list and watch (`watch=true|1`, `resourceVersion`, `allowWatchBookmarks`,
  `timeoutSeconds`, `labelSelector` (equality, existence and set-based), `fieldSelector` on
  `metadata.name`/`metadata.namespace`), over `/api/v1` and `/apis/G/V`;
- an object that enters or leaves a watch's selector is ADDED or DELETED for
  that watch, as the API server's watch cache sends it;
- one global resourceVersion counter and an event log; a watch from a version
  older than the compaction point gets 410 Gone, either as an ERROR event in
  a 200 stream (what kube-apiserver does) or as the HTTP status;
- get; create (201, 409 if it exists) and replace (409 on a stale
  resourceVersion); JSON merge patch of the `status` subresource, honouring a
  `metadata.resourceVersion` precondition (409 on mismatch);
- a resource served through several versions: the stored object is rewritten
  to the requested version, and `prune` hooks drop what that version does not
  declare (InferenceObjective v1 loses `spec.poolRef`, as the real server
  prunes with conversion None);
- fault injection: `drop_watches()`, `compact()`, `bookmark()`, `fail()`,
  and `hold()`/`release()` (one kind's watches lag behind the others', as
  separate watch connections may: events of other kinds overtake them);
- TokenReview (tokens registered with `add_token`) and SubjectAccessReview
  for non-resource URLs (grants registered with `allow`), the two reviews a
  delegating authenticator and authorizer make; `reviews` records each.

Tests change objects in-process (`apply`, `delete`), as another client would.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from epp.api.registry import ObjectiveRegistry
from epp.datalayer.store import EndpointStore
from epp.k8s.cluster import ClusterMode
from epp.k8s.leader import LeaseSettings
from epp.k8s.reflector import WatchSettings
from tests.support.waiting import eventually

ResourceKey = tuple[str, str]
"""(group, plural); the core group is ""."""

Prune = Callable[[dict[str, Any]], None]

OBJECTIVES = ("llm-d.ai", "inferenceobjectives")
POOLS = ("inference.networking.k8s.io", "inferencepools")
PODS = ("", "pods")
LEASES = ("coordination.k8s.io", "leases")


def _drop_pool_ref(obj: dict[str, Any]) -> None:
    (obj.get("spec") or {}).pop("poolRef", None)


DEFAULT_PRUNE: dict[tuple[str, str, str], Prune] = {
    (*OBJECTIVES, "v1"): _drop_pool_ref,
}
STATUS_SUBRESOURCE = frozenset({OBJECTIVES})
"""Kinds whose status `apply` leaves alone (the EPP owns it); tests set pod
status with `apply`, as the kubelet would through its subresource."""


def resource_of(obj: dict[str, Any]) -> ResourceKey:
    group = obj["apiVersion"].rpartition("/")[0]
    return group, obj["kind"].lower() + "s"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _selector_terms(selector: str) -> list[str]:
    """The comma-separated terms of a label selector (commas inside
    `in (...)` sets do not split)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    terms.append(current.strip())
    return [term for term in terms if term]


def _labels_match(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: `k=v`, `k==v`, `k!=v`, `k`, `!k`,
    `k in (a,b)`, `k notin (a,b)`."""
    for term in _selector_terms(selector):
        words = term.split(None, 1)
        if len(words) == 2 and words[1].startswith(("in ", "in(", "notin ", "notin(")):
            operator, _, values = words[1].partition("(")
            allowed = {value.strip() for value in values.rstrip(")").split(",")}
            if operator.strip() == "in" and labels.get(words[0]) not in allowed:
                return False
            if operator.strip() == "notin" and labels.get(words[0]) in allowed:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(selector: str, obj: dict[str, Any]) -> bool:
    metadata = obj.get("metadata") or {}
    for term in filter(None, (part.strip() for part in selector.split(","))):
        key, value = term.replace("==", "=").split("=", 1)
        if metadata.get(key.removeprefix("metadata.")) != value:
            return False
    return True


@dataclass(slots=True)
class _Event:
    version: int
    resource: ResourceKey
    kind: str
    object: dict[str, Any]
    previous: dict[str, Any] | None = None
    """The object before a MODIFIED event (a selector may match only one of them)."""


@dataclass(slots=True, eq=False)
class _Watcher:
    resource: ResourceKey
    namespace: str
    bookmarks: bool
    queue: asyncio.Queue[_Event | None] = field(default_factory=asyncio.Queue)
    held: list[_Event] | None = None
    """Events (and bookmarks) kept back, in order, while the watch is held."""

    def deliver(self, event: _Event) -> None:
        if self.held is not None:
            self.held.append(event)
        else:
            self.queue.put_nowait(event)


@dataclass(slots=True)
class Write:
    """One write request the server answered, for assertions."""

    method: str
    path: str
    status: int
    body: Any


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class KubeEmulator:
    """See the module docstring. Use as `async with KubeEmulator() as kube:`."""

    def __init__(self, gone_as_http_status: bool = False) -> None:
        self.gone_as_http_status = gone_as_http_status
        """Answer a too-old watch with HTTP 410 instead of an ERROR event."""
        self.prune = dict(DEFAULT_PRUNE)
        self.objects: dict[tuple[ResourceKey, str, str], dict[str, Any]] = {}
        self.writes: list[Write] = []
        self.watch_requests: list[dict[str, str]] = []
        self.list_requests: list[dict[str, str]] = []
        self._events: list[_Event] = []
        self._version = 0
        self._compacted = 0
        self._uids = itertools.count(1)
        self._watchers: set[_Watcher] = set()
        self._holding: set[ResourceKey] = set()
        self._failing: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.tokens: dict[str, dict[str, Any]] = {}
        self.grants: set[tuple[str, str, str]] = set()
        self.reviews: list[dict[str, Any]] = []

    async def __aenter__(self) -> KubeEmulator:
        app = web.Application()
        app.router.add_route(
            "*", "/api/{version}/namespaces/{namespace}/{plural}{rest:.*}", self._core
        )
        app.router.add_route(
            "*", "/apis/{group}/{version}/namespaces/{namespace}/{plural}{rest:.*}", self._grouped
        )
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review
        )
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.drop_watches()
        assert self._runner is not None
        await self._runner.cleanup()

    def api_client(self) -> ApiClient:
        configuration = Configuration(host=self.url)
        return ApiClient(configuration)

    def write_kubeconfig(self, path: Path) -> str:
        """A kubeconfig file at `path` pointing at this emulator; its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "secret"}}],
            "contexts": [{"name": "test", "context": {"cluster": "emulator", "user": "tester"}}],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(config))
        return str(path)

    # -- test-side changes and fault injection ---------------------------------

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace `obj`; generation grows when the spec changes.
        A replace keeps the stored status of a kind with a status subresource
        (as the API server ignores status outside the subresource), and of
        any kind when `obj` has none."""
        obj = copy.deepcopy(obj)
        resource = resource_of(obj)
        metadata = obj.setdefault("metadata", {})
        namespace = metadata.setdefault("namespace", "default")
        key = (resource, namespace, metadata["name"])
        current = self.objects.get(key)
        if current is None:
            metadata["uid"] = f"uid-{next(self._uids)}"
            metadata["generation"] = 1
            metadata["creationTimestamp"] = "2026-01-01T00:00:00Z"
            kind = "ADDED"
        else:
            for name in ("uid", "creationTimestamp"):
                metadata[name] = current["metadata"][name]
            changed = obj.get("spec") != current.get("spec")
            metadata["generation"] = current["metadata"]["generation"] + int(changed)
            if resource in STATUS_SUBRESOURCE or "status" not in obj:
                obj.pop("status", None)
                if "status" in current:
                    obj["status"] = current["status"]
            kind = "MODIFIED"
        self._store(key, obj, kind)
        return copy.deepcopy(obj)

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "default") -> None:
        resource = resource_of({"apiVersion": api_version, "kind": kind})
        obj = self.objects.pop((resource, namespace, name))
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._publish(_Event(self._version, resource, "DELETED", obj))

    def get(self, api_version: str, kind: str, name: str, namespace: str = "default") -> dict:
        resource = resource_of({"apiVersion": api_version, "kind": kind})
        return copy.deepcopy(self.objects[(resource, namespace, name)])

    def drop_watches(self) -> None:
        """End every open watch stream (as a restarted API server would)."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()

    def hold(self, resource: ResourceKey) -> None:
        """Keep back what open and new watches of `resource` would receive
        (events, bookmarks) until `release()`; other kinds' watches, writes
        and lists go on. Order within each watch is kept."""
        self._holding.add(resource)
        for watcher in self._watchers:
            if watcher.resource == resource and watcher.held is None:
                watcher.held = []

    def release(self) -> None:
        """Deliver everything `hold` kept back, in order, and hold no more."""
        self._holding.clear()
        for watcher in self._watchers:
            held, watcher.held = watcher.held or [], None
            for event in held:
                watcher.queue.put_nowait(event)

    def compact(self) -> None:
        """Forget the event history: a watch from any older version gets 410."""
        self._compacted = self._version
        self._events.clear()

    def bookmark(self) -> str:
        """Send a BOOKMARK at the current version to watches that allow them;
        returns that version."""
        for watcher in self._watchers:
            if watcher.bookmarks:
                watcher.deliver(_Event(self._version, watcher.resource, "BOOKMARK", {}))
        return str(self._version)

    def fail(self, path_part: str, status: int = 503) -> None:
        """Answer every request whose path contains `path_part` with `status`
        (an outage of part of the API) until `heal()`."""
        self._failing[path_part] = status

    def heal(self) -> None:
        self._failing.clear()

    def add_token(self, token: str, username: str, groups: tuple[str, ...] = ()) -> None:
        """A bearer token TokenReview accepts as `username`."""
        self.tokens[token] = {"username": username, "uid": f"uid-{username}", "groups": [*groups]}

    def allow(self, subject: str, path: str = "/metrics", verb: str = "get") -> None:
        """Let a user or group `verb` the non-resource URL `path`."""
        self.grants.add((subject, verb, path))

    def open_watches(self) -> int:
        return len(self._watchers)

    def status_writes(self) -> list[Write]:
        return [write for write in self.writes if write.path.endswith("/status")]

    # -- HTTP ------------------------------------------------------------------

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "", request.match_info["version"])

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        return await self._serve(request, info["group"], info["version"])

    def _injected_failure(self, request: web.Request) -> web.Response | None:
        for part, status in self._failing.items():
            if part in request.path:
                return self._error(status, "ServiceUnavailable", "injected failure")
        return None

    async def _serve(self, request: web.Request, group: str, version: str) -> web.StreamResponse:
        if (failure := self._injected_failure(request)) is not None:
            return failure
        info = request.match_info
        resource = (group, info["plural"])
        namespace = info["namespace"]
        parts = [part for part in info["rest"].split("/") if part]
        name = parts[0] if parts else None
        subresource = parts[1] if len(parts) > 1 else None
        query = dict(request.query)
        if request.method == "GET" and name is None:
            if query.get("watch", "").lower() in ("true", "1"):
                return await self._watch(request, resource, version, namespace, query)
            return self._list(resource, version, namespace, query)
        if request.method == "GET":
            obj = self.objects.get((resource, namespace, name))
            if obj is None:
                return self._error(404, "NotFound", f"{info['plural']} {name!r} not found")
            return web.json_response(self._served(obj, resource, version))
        body = await request.json() if request.can_read_body else None
        if request.method == "POST" and name is None:
            response = self._create(resource, namespace, body)
        elif request.method == "PUT" and name is not None and subresource is None:
            response = self._replace(resource, namespace, name, body)
        elif request.method == "PATCH" and subresource == "status":
            response = self._patch_status(resource, version, namespace, name, body, request)
        else:
            response = self._error(405, "MethodNotAllowed", f"{request.method} {request.path}")
        self.writes.append(Write(request.method, request.path, response.status, body))
        return response

    def _list(
        self, resource: ResourceKey, version: str, namespace: str, query: dict[str, str]
    ) -> web.Response:
        self.list_requests.append(query)
        items = [
            self._served(obj, resource, version)
            for (res, ns, _), obj in sorted(self.objects.items())
            if res == resource and ns == namespace and self._selected(obj, query)
        ]
        return web.json_response(
            {"kind": "List", "metadata": {"resourceVersion": str(self._version)}, "items": items}
        )

    async def _watch(
        self,
        request: web.Request,
        resource: ResourceKey,
        version: str,
        namespace: str,
        query: dict[str, str],
    ) -> web.StreamResponse:
        self.watch_requests.append(query)
        since = query.get("resourceVersion")
        too_old = since not in (None, "", "0") and int(since) < self._compacted
        gone = _status(410, "Expired", f"too old resource version: {since} ({self._compacted})")
        if too_old and self.gone_as_http_status:
            return web.json_response(gone, status=410)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if too_old:
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        watcher = _Watcher(
            resource, namespace, query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        )
        if resource in self._holding:
            watcher.held = []
        if since in (None, "", "0"):
            backlog = [
                _Event(self._version, resource, "ADDED", obj)
                for (res, _, _), obj in sorted(self.objects.items())
                if res == resource
            ]
        else:
            backlog = [event for event in self._events if event.version > int(since)]
        for event in backlog:
            watcher.deliver(event)
        self._watchers.add(watcher)
        timeout = float(query.get("timeoutSeconds") or 3600)
        try:
            async with asyncio.timeout(timeout):
                while (event := await watcher.queue.get()) is not None:
                    line = self._event_line(event, watcher, version, query)
                    if line is not None:
                        await response.write(line)
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self._watchers.discard(watcher)
        return response

    def _event_line(
        self, event: _Event, watcher: _Watcher, version: str, query: dict[str, str]
    ) -> bytes | None:
        if event.resource != watcher.resource:
            return None
        if event.kind == "BOOKMARK":
            group, plural = event.resource
            obj = {
                "apiVersion": f"{group}/{version}".lstrip("/"),
                "kind": plural,
                "metadata": {"resourceVersion": str(event.version)},
            }
            return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"
        if event.object["metadata"]["namespace"] != watcher.namespace:
            return None
        kind = event.kind
        selected = self._selected(event.object, query)
        if kind == "MODIFIED" and event.previous is not None:
            was_selected = self._selected(event.previous, query)
            if selected != was_selected:
                # as the API server's watch cache: an object entering or
                # leaving a selector's view is ADDED or DELETED for that watch
                kind = "ADDED" if selected else "DELETED"
                selected = True
        if not selected:
            return None
        obj = self._served(event.object, event.resource, version)
        return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

    def _create(self, resource: ResourceKey, namespace: str, body: Any) -> web.Response:
        body.setdefault("metadata", {})["namespace"] = namespace
        key = (resource, namespace, body["metadata"]["name"])
        if key in self.objects:
            return self._error(409, "AlreadyExists", f"{body['metadata']['name']} already exists")
        return web.json_response(self.apply(body), status=201)

    def _replace(self, resource: ResourceKey, namespace: str, name: str, body: Any) -> web.Response:
        current = self.objects.get((resource, namespace, name))
        if current is None:
            return self._error(404, "NotFound", f"{name!r} not found")
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected != current["metadata"]["resourceVersion"]:
            return self._error(409, "Conflict", "the object has been modified")
        body["metadata"]["namespace"] = namespace
        return web.json_response(self.apply(body))

    def _patch_status(
        self,
        resource: ResourceKey,
        version: str,
        namespace: str,
        name: str | None,
        body: Any,
        request: web.Request,
    ) -> web.Response:
        if request.content_type != "application/merge-patch+json":
            return self._error(415, "UnsupportedMediaType", request.content_type)
        key = (resource, namespace, name or "")
        current = self.objects.get(key)
        if current is None:
            return self._error(404, "NotFound", f"{name!r} not found")
        expected = (body.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            return self._error(409, "Conflict", "the object has been modified")
        updated = copy.deepcopy(current)
        updated["status"] = merge_patch(current.get("status"), body.get("status"))
        self._store(key, updated, "MODIFIED")
        return web.json_response(self._served(updated, resource, version))

    async def _token_review(self, request: web.Request) -> web.Response:
        if (failure := self._injected_failure(request)) is not None:
            return failure
        review = await request.json()
        self.reviews.append(review)
        user = self.tokens.get(review["spec"].get("token", ""))
        review["status"] = {"authenticated": True, "user": user} if user else {}
        return web.json_response(review, status=201)

    async def _access_review(self, request: web.Request) -> web.Response:
        if (failure := self._injected_failure(request)) is not None:
            return failure
        review = await request.json()
        self.reviews.append(review)
        spec = review["spec"]
        attributes = spec.get("nonResourceAttributes") or {}
        subjects = [spec.get("user", ""), *(spec.get("groups") or [])]
        allowed = any(
            (subject, attributes.get("verb"), attributes.get("path")) in self.grants
            for subject in subjects
        )
        review["status"] = {"allowed": allowed}
        return web.json_response(review, status=201)

    # -- internals -------------------------------------------------------------

    def _store(self, key: tuple[ResourceKey, str, str], obj: dict[str, Any], kind: str) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        previous = self.objects.get(key)
        self.objects[key] = obj
        self._publish(_Event(self._version, key[0], kind, copy.deepcopy(obj), previous))

    def _publish(self, event: _Event) -> None:
        self._events.append(event)
        for watcher in self._watchers:
            watcher.deliver(event)

    def _served(self, obj: dict[str, Any], resource: ResourceKey, version: str) -> dict:
        served = copy.deepcopy(obj)
        group = resource[0]
        served["apiVersion"] = f"{group}/{version}" if group else version
        prune = self.prune.get((*resource, version))
        if prune is not None:
            prune(served)
        return served

    @staticmethod
    def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return _labels_match(query.get("labelSelector", ""), labels) and _fields_match(
            query.get("fieldSelector", ""), obj
        )

    @staticmethod
    def _error(code: int, reason: str, message: str) -> web.Response:
        return web.json_response(_status(code, reason, message), status=code)


# -- cluster mode under test ------------------------------------------------------

FAST_WATCH = WatchSettings(timeout_seconds=30, backoff_initial=0.05, backoff_max=0.2)
FAST_LEASE = LeaseSettings(lease_duration=1.0, renew_deadline=0.6, retry_period=0.1)


@dataclass(slots=True)
class Epp:
    mode: ClusterMode
    store: EndpointStore

    @property
    def registry(self) -> ObjectiveRegistry:
        assert self.mode.registry is not None
        return self.mode.registry

    def addresses(self) -> set[str]:
        return set(self.store.addresses())


async def caught_up(kube: KubeEmulator, *epps: Epp, timeout: float = 5.0) -> None:
    """Until each EPP has seen every change made so far (its objective and
    pool watches are at the emulator's version: a BOOKMARK per look) and has
    written every status that follows from them."""

    def seen_and_written() -> bool:
        version = int(kube.bookmark())
        return all(
            all(
                int(reflector.resource_version or 0) >= version
                for reflector in (epp.mode.objective_reflector, epp.mode.pool_reflector)
            )
            and epp.mode.status.settled
            for epp in epps
        )

    await eventually(seen_and_written, timeout)


StartEpp = Callable[..., Awaitable[Epp]]
"""The `start_epp` fixture: starts an EPP in cluster mode against the emulator."""


# -- objects for tests -----------------------------------------------------------

PLACEHOLDER_STATUS = {
    "conditions": [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "Pending",
            "message": "Waiting for controller",
            "lastTransitionTime": "1970-01-01T00:00:00Z",
        }
    ]
}


def pool(
    name: str = "pool-a",
    selector: dict[str, str] | None = None,
    ports: tuple[int, ...] = (8000,),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {
            "selector": {"matchLabels": selector or {"app": name}},
            "targetPorts": [{"number": port} for port in ports],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
        },
    }


def pod(
    name: str,
    ip: str,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "labels": labels or {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def objective(
    name: str,
    priority: int = 0,
    pools: tuple[str, ...] = ("pool-a",),
    pool_selector: dict[str, Any] | None = None,
    v1alpha2_pool_ref: str | None = None,
) -> dict[str, Any]:
    """A v1 objective with `poolRefs` (and/or a `poolSelector`), or with
    `v1alpha2_pool_ref` a v1alpha2 one with only `poolRef`. It carries the
    CRD's placeholder status, as the API server defaults it."""
    spec: dict[str, Any] = {"priority": priority}
    if v1alpha2_pool_ref is not None:
        spec["poolRef"] = {"name": v1alpha2_pool_ref}
        version = "v1alpha2"
    else:
        version = "v1"
        if pools:
            spec["poolRefs"] = [{"name": pool_name} for pool_name in pools]
    if pool_selector is not None:
        spec["poolSelector"] = pool_selector
    return {
        "apiVersion": f"llm-d.ai/{version}",
        "kind": "InferenceObjective",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
        "status": copy.deepcopy(PLACEHOLDER_STATUS),
    }
