"""Building and reading ext_proc messages with the generated protobuf classes."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from functools import lru_cache

from epp.extproc.gen.envoy.config.core.v3 import base_pb2
from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.extproc.headers import DESTINATION_ENDPOINT, LB_NAMESPACE

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse
HttpHeaders = pb.HttpHeaders

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
CHUNK_BYTES = 62_000
"""Largest body chunk sent back to Envoy (the reference EPP's size; Envoy advises <= 64 KiB)."""


def read_request_headers(headers: pb.HttpHeaders) -> tuple[dict[str, str], int, int]:
    """Header name -> value (`raw_value` when set, else `value`; later
    duplicates win), with the number of header fields and the bytes of their
    names and values, in one pass (each field read costs a protobuf wrapper)."""
    fields = headers.headers.headers
    values: dict[str, str] = {}
    size = 0
    for field in fields:
        key = field.key
        raw = field.raw_value
        if raw:
            size += len(key) + len(raw)
            values[key] = raw.decode("utf-8", "replace")
        else:
            value = field.value
            size += len(key) + len(value)
            values[key] = value
    return values, len(fields), size


def response_status_and_type(headers: pb.HttpHeaders) -> tuple[int | None, str]:
    """The upstream's `:status` (None: absent or not a number) and content
    type ("" if none) of a response's headers, in one pass over them."""
    status = None
    content_type = ""
    for field in headers.headers.headers:
        key = field.key
        if key == ":status" or key == "content-type":
            raw = field.raw_value
            value = raw.decode("utf-8", "replace") if raw else field.value
            if key == "content-type":
                content_type = value
            else:
                status = int(value) if value.isdigit() else None
    return status, content_type


def _set_headers(mutation: pb.HeaderMutation, values: Iterable[tuple[str, str]]) -> None:
    for key, value in values:
        option = mutation.set_headers.add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = OVERWRITE


def routed_headers_reply(
    endpoint: str, set_headers: Iterable[tuple[str, str]], remove_headers: Iterable[str]
) -> ProcessingResponse:
    """The answer to the request headers of a request dispatched to `endpoint`:
    its destination header, the same in the `envoy.lb` dynamic metadata, the
    route cache cleared; then `set_headers` and `remove_headers`. The part
    that depends only on the endpoint is built once per endpoint (parsing it
    back costs a third of building it)."""
    response = ProcessingResponse.FromString(_routed_template(endpoint))
    mutation = response.request_headers.response.header_mutation
    _set_headers(mutation, set_headers)
    mutation.remove_headers.extend(remove_headers)
    return response


@lru_cache(maxsize=4096)
def _routed_template(endpoint: str) -> bytes:
    response = ProcessingResponse()
    common = response.request_headers.response
    common.clear_route_cache = True
    _set_headers(common.header_mutation, [(DESTINATION_ENDPOINT, endpoint)])
    lb = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    lb.fields[DESTINATION_ENDPOINT].string_value = endpoint
    return response.SerializeToString()


def body_chunks(
    body: bytes, end_of_stream: bool, *, response: bool = False
) -> list[ProcessingResponse]:
    """`body` as streamed body replies of at most CHUNK_BYTES, EoS on the last."""
    starts = range(0, len(body), CHUNK_BYTES) if body else range(1)
    last = starts[-1]
    replies = []
    for start in starts:
        reply = ProcessingResponse()
        target = reply.response_body if response else reply.request_body
        streamed = target.response.body_mutation.streamed_response
        streamed.body = body[start : start + CHUNK_BYTES]
        streamed.end_of_stream = end_of_stream and start == last
        replies.append(reply)
    return replies


def response_body_reply(chunk: bytes, end_of_stream: bool) -> ProcessingResponse:
    """One response body chunk echoed as it came (at most CHUNK_BYTES)."""
    reply = ProcessingResponse()
    streamed = reply.response_body.response.body_mutation.streamed_response
    streamed.body = chunk
    streamed.end_of_stream = end_of_stream
    return reply


def response_headers_reply(set_headers: Collection[tuple[str, str]] = ()) -> ProcessingResponse:
    """The answer to the response headers: unchanged but for `set_headers`."""
    reply = ProcessingResponse()
    common = reply.response_headers.response
    common.SetInParent()
    if set_headers:
        _set_headers(common.header_mutation, set_headers)
    return reply


def trailers_reply(*, response: bool) -> ProcessingResponse:
    reply = ProcessingResponse()
    (reply.response_trailers if response else reply.request_trailers).SetInParent()
    return reply


def immediate_response(
    status: int, body: str | bytes, headers: Iterable[tuple[str, str]] = (), details: str = ""
) -> ProcessingResponse:
    """A local reply: Envoy answers the client with `status` and `body`
    (text/plain unless `headers` set a content type).

    `details` (no whitespace) shows in Envoy's `%RESPONSE_CODE_DETAILS%`.
    """
    reply = ProcessingResponse()
    immediate = reply.immediate_response
    immediate.status.code = status
    immediate.body = body.encode() if isinstance(body, str) else body
    immediate.details = details
    _set_headers(immediate.headers, headers)
    return reply


def lb_subset(request: ProcessingRequest) -> list[str] | None:
    """Envoy's subset hint, `envoy.lb` / `x-gateway-destination-endpoint-subset`, if sent."""
    if not request.HasField("metadata_context"):
        return None
    namespace = request.metadata_context.filter_metadata.get("envoy.lb")
    if namespace is None or "x-gateway-destination-endpoint-subset" not in namespace.fields:
        return None
    value = namespace.fields["x-gateway-destination-endpoint-subset"]
    if value.HasField("list_value"):
        return [item.string_value for item in value.list_value.values]
    if value.HasField("string_value"):
        return [part.strip() for part in value.string_value.split(",") if part.strip()]
    return []
