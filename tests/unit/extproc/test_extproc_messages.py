"""Reading header maps from Envoy's messages."""

from __future__ import annotations

from epp.extproc import messages
from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2 as pb


def http_headers(*fields: tuple[str, str, bytes]) -> pb.HttpHeaders:
    headers = pb.HttpHeaders()
    for key, value, raw_value in fields:
        headers.headers.headers.add(key=key, value=value, raw_value=raw_value)
    return headers


def test_request_headers_read_raw_value_first_and_count_every_field():
    headers = http_headers(
        (":path", "", b"/v1/completions"),
        ("x-old", "plain", b""),
        ("x-dup", "", b"first"),
        ("x-dup", "", b"second"),
    )
    values, count, size = messages.read_request_headers(headers)
    assert values == {":path": "/v1/completions", "x-old": "plain", "x-dup": "second"}
    assert count == 4
    assert size == (5 + 15) + (5 + 5) + (5 + 5) + (5 + 6)


def test_request_header_raw_values_that_are_not_utf8_are_read_with_replacement():
    headers = http_headers(("a", "", b"\xff"), ("b", "v", b""))
    assert messages.read_request_headers(headers)[0] == {"a": "\ufffd", "b": "v"}


def test_a_responses_status_and_content_type_are_the_last_of_their_name():
    headers = http_headers(
        (":status", "", b"200"),
        ("content-type", "", b"text/plain"),
        ("content-type", "text/event-stream", b""),
        (":status", "404", b""),
    )
    assert messages.response_status_and_type(headers) == (404, "text/event-stream")


def test_a_response_without_a_numeric_status_or_a_type_reads_none_and_empty():
    assert messages.response_status_and_type(http_headers((":status", "", b"ok"))) == (None, "")


def test_routed_reply_sets_destination_metadata_and_the_other_headers():
    reply = messages.routed_headers_reply("10.0.0.1:80", [("content-length", "12")], ["x-a"])
    common = reply.request_headers.response
    assert common.clear_route_cache
    assert [(o.header.key, o.header.raw_value) for o in common.header_mutation.set_headers] == [
        ("x-gateway-destination-endpoint", b"10.0.0.1:80"),
        ("content-length", b"12"),
    ]
    assert list(common.header_mutation.remove_headers) == ["x-a"]
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields["x-gateway-destination-endpoint"].string_value == "10.0.0.1:80"


def test_routed_replies_of_one_endpoint_do_not_share_headers():
    first = messages.routed_headers_reply("10.0.0.1:80", [("content-length", "1")], [])
    second = messages.routed_headers_reply("10.0.0.1:80", [("content-length", "2")], [])
    set_headers = second.request_headers.response.header_mutation.set_headers
    assert [o.header.raw_value for o in set_headers] == [b"10.0.0.1:80", b"2"]
    assert len(first.request_headers.response.header_mutation.set_headers) == 2
