"""Our generated classes against envoy-data-plane (the reference), both ways, per message kind."""

from __future__ import annotations

import datetime
import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # pydantic deprecations in the reference
    from envoy_data_plane.envoy.config.core import v3 as ref_core
    from envoy_data_plane.envoy.extensions.filters.http.ext_proc import v3 as ref_mode
    from envoy_data_plane.envoy.service.ext_proc import v3 as ref
    from envoy_data_plane.google import protobuf as ref_pb
from extproc_wire import (
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
    response_trailers,
)
from google.protobuf.json_format import MessageToDict

from epp.extproc import messages
from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def _with_context(message: pb.ProcessingRequest) -> pb.ProcessingRequest:
    message.attributes["envoy.filters.http.ext_proc"].fields["request.path"].string_value = "/x"
    message.protocol_config.request_body_mode = 4
    message.protocol_config.response_body_mode = 4
    return message


def _every_response_field() -> pb.ProcessingResponse:
    reply = messages.routed_headers_reply("10.0.0.1:80", [("a", "b")], ["c"])
    reply.mode_override.response_body_mode = 4
    reply.mode_override.request_trailer_mode = 1
    reply.override_message_timeout.seconds = 2
    reply.request_drain = True
    return reply


def _immediate_with_grpc_status() -> pb.ProcessingResponse:
    reply = messages.immediate_response(503, "dropped\n", [("x-r", "why")], "why")
    reply.immediate_response.grpc_status.status = 14
    return reply


def _streamed_immediate() -> pb.ProcessingResponse:
    reply = pb.ProcessingResponse()
    reply.streamed_immediate_response.body_response.body = b"x"
    return reply


RECEIVED = {
    "request_headers": _with_context(
        request_headers({":path": "/v1/chat/completions", "x": "y"}, subset=["1.2.3.4:80"])
    ),
    "request_headers_eos": request_headers({":path": "/"}, end_of_stream=True),
    "request_body": request_body(b'{"model":"m"}', end_of_stream=True),
    "request_trailers": request_trailers(),
    "response_headers": response_headers({":status": "200", "content-type": "text/event-stream"}),
    "response_body": response_body(b"data: {}\n\n", end_of_stream=False),
    "response_trailers": response_trailers(),
}
SENT = {
    "request_headers_reply": messages.routed_headers_reply(
        "10.0.0.1:80", [("content-length", "12")], ["x-llm-d-inference-objective"]
    ),
    "request_body_chunk": messages.body_chunks(b"x" * 10, True)[0],
    "response_headers_reply": messages.response_headers_reply(),
    "response_body_chunk": messages.response_body_reply(b"data: {}\n\n", False),
    "request_trailers_reply": messages.trailers_reply(response=False),
    "response_trailers_reply": messages.trailers_reply(response=True),
    "immediate_response": messages.immediate_response(
        429, "dropped\n", [("x-llm-d-request-dropped-reason", "rejected-saturated")], "r"
    ),
    "immediate_response_grpc_status": _immediate_with_grpc_status(),
    "every_response_field": _every_response_field(),
    "streamed_immediate_response": _streamed_immediate(),
}


@pytest.mark.parametrize("name", RECEIVED)
def test_received_message_decodes_identically_in_reference(name):
    ours = RECEIVED[name]
    theirs = ref.ProcessingRequest.parse(ours.SerializeToString())
    assert theirs.to_dict() == MessageToDict(ours)
    assert pb.ProcessingRequest.FromString(bytes(theirs)) == ours


@pytest.mark.parametrize("name", SENT)
def test_sent_message_decodes_identically_in_reference(name):
    ours = SENT[name]
    theirs = ref.ProcessingResponse.parse(ours.SerializeToString())
    assert theirs.to_dict() == MessageToDict(ours)
    assert pb.ProcessingResponse.FromString(bytes(theirs)) == ours


def _ref_headers(pairs: dict[str, str]) -> ref_core.HeaderMap:
    return ref_core.HeaderMap(
        headers=[ref_core.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )


REFERENCE_BUILT = {
    "request_headers": ref.ProcessingRequest(
        request_headers=ref.HttpHeaders(headers=_ref_headers({":path": "/v1/completions"})),
        metadata_context=ref_core.Metadata(
            filter_metadata={
                "envoy.lb": ref_pb.Struct(
                    fields={
                        "x-gateway-destination-endpoint-subset": ref_pb.Value(
                            list_value=ref_pb.ListValue(
                                values=[ref_pb.Value(string_value="10.0.0.1:80")]
                            )
                        )
                    }
                )
            }
        ),
        protocol_config=ref.ProtocolConfiguration(
            request_body_mode=ref_mode.ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED
        ),
    ),
    "request_body": ref.ProcessingRequest(
        request_body=ref.HttpBody(body=b"{}", end_of_stream=True)
    ),
    "request_trailers": ref.ProcessingRequest(
        request_trailers=ref.HttpTrailers(trailers=_ref_headers({"t": "1"}))
    ),
    "response_headers": ref.ProcessingRequest(
        response_headers=ref.HttpHeaders(
            headers=_ref_headers({":status": "200"}), end_of_stream=True
        )
    ),
    "response_body": ref.ProcessingRequest(
        response_body=ref.HttpBody(body=b"x", end_of_stream=True)
    ),
    "response_trailers": ref.ProcessingRequest(
        response_trailers=ref.HttpTrailers(trailers=_ref_headers({"t": "2"}))
    ),
    "headers_reply": ref.ProcessingResponse(
        request_headers=ref.HeadersResponse(
            response=ref.CommonResponse(
                clear_route_cache=True,
                header_mutation=ref.HeaderMutation(
                    set_headers=[
                        ref_core.HeaderValueOption(
                            header=ref_core.HeaderValue(key="a", raw_value=b"b"),
                            append_action=ref_core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
                        )
                    ],
                    remove_headers=["c"],
                ),
            )
        ),
        dynamic_metadata=ref_pb.Struct(
            fields={
                "envoy.lb": ref_pb.Value(
                    struct_value=ref_pb.Struct(fields={"k": ref_pb.Value(string_value="v")})
                )
            }
        ),
        override_message_timeout=datetime.timedelta(seconds=3),
    ),
    "body_reply": ref.ProcessingResponse(
        response_body=ref.BodyResponse(
            response=ref.CommonResponse(
                body_mutation=ref.BodyMutation(
                    streamed_response=ref.StreamedBodyResponse(body=b"x", end_of_stream=True)
                )
            )
        )
    ),
}


@pytest.mark.parametrize("name", REFERENCE_BUILT)
def test_reference_encoded_message_decodes_identically_in_ours(name):
    theirs = REFERENCE_BUILT[name]
    ours_type = (
        pb.ProcessingRequest if isinstance(theirs, ref.ProcessingRequest) else pb.ProcessingResponse
    )
    ours = ours_type.FromString(bytes(theirs))
    assert MessageToDict(ours) == theirs.to_dict()
    assert ours.SerializeToString() == bytes(theirs)
