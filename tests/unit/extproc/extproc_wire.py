"""Builders for the ProcessingRequests Envoy sends, for the ext_proc unit tests."""

from __future__ import annotations

from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def _headers(phase: str, headers: dict[str, str], end_of_stream: bool) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest()
    part = getattr(message, phase)
    part.end_of_stream = end_of_stream
    for key, value in headers.items():
        part.headers.headers.add(key=key, raw_value=value.encode())
    return message


def _body(phase: str, body: bytes, end_of_stream: bool) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest()
    part = getattr(message, phase)
    part.body = body
    part.end_of_stream = end_of_stream
    return message


def _trailers(phase: str) -> pb.ProcessingRequest:
    message = pb.ProcessingRequest()
    getattr(message, phase).trailers.SetInParent()
    return message


def request_headers(
    headers: dict[str, str], *, end_of_stream: bool = False, subset: list[str] | None = None
) -> pb.ProcessingRequest:
    message = _headers("request_headers", headers, end_of_stream)
    if subset is not None:
        lb = message.metadata_context.filter_metadata["envoy.lb"]
        lb.fields["x-gateway-destination-endpoint-subset"].list_value.extend(subset)
    return message


def request_body(body: bytes, *, end_of_stream: bool = True) -> pb.ProcessingRequest:
    return _body("request_body", body, end_of_stream)


def request_trailers() -> pb.ProcessingRequest:
    return _trailers("request_trailers")


def response_headers(
    headers: dict[str, str], *, end_of_stream: bool = False
) -> pb.ProcessingRequest:
    return _headers("response_headers", headers, end_of_stream)


def response_body(body: bytes, *, end_of_stream: bool = False) -> pb.ProcessingRequest:
    return _body("response_body", body, end_of_stream)


def response_trailers() -> pb.ProcessingRequest:
    return _trailers("response_trailers")


def set_headers(reply: pb.ProcessingResponse) -> dict[str, str]:
    """Header name -> value set by a request-headers reply."""
    mutation = reply.request_headers.response.header_mutation
    return {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}


def streamed(reply: pb.ProcessingResponse) -> tuple[bytes, bool]:
    """(body, end_of_stream) of a streamed body reply, request or response side."""
    kind = reply.WhichOneof("response")
    chunk = getattr(reply, kind).response.body_mutation.streamed_response
    return chunk.body, chunk.end_of_stream
