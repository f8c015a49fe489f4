"""Our codec against envoy-data-plane, measured in the same run (best of 5)."""

from __future__ import annotations

import timeit
import warnings

from extproc_wire import request_headers

from epp.extproc import messages
from epp.extproc.gen.envoy.service.ext_proc.v3 import external_processor_pb2 as pb

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # pydantic deprecations in the reference
    from envoy_data_plane.envoy.service.ext_proc import v3 as ref

HEADERS = {
    ":authority": "gateway:8081",
    ":path": "/v1/chat/completions",
    ":method": "POST",
    ":scheme": "http",
    "content-type": "application/json",
    "content-length": "1024",
    "user-agent": "bench/1.0",
    "x-forwarded-proto": "http",
    "x-request-id": "5f6b8d5e-7a0c-4b4e-9d7e-2f1e3c4b5a69",
    "x-llm-d-inference-objective": "gold",
    "x-llm-d-inference-fairness-id": "tenant-a",
    "accept": "*/*",
}
ENDPOINT = "10.0.0.1:8000"
MIN_SPEEDUP = 10.0
"""Measured about 50x for both directions; the bound leaves room for a noisy machine."""


def per_call_us(function, number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e6


def header_reply() -> pb.ProcessingResponse:
    return messages.routed_headers_reply(
        ENDPOINT,
        [("content-length", "1024")],
        ["x-llm-d-inference-objective", "x-llm-d-inference-fairness-id"],
    )


def test_request_headers_parse_is_much_faster_than_reference():
    wire = request_headers(HEADERS, subset=[ENDPOINT]).SerializeToString()

    def ours():
        messages.read_request_headers(pb.ProcessingRequest.FromString(wire).request_headers)

    ours_us = per_call_us(ours, 2000)
    reference_us = per_call_us(lambda: ref.ProcessingRequest.parse(wire), 100)
    assert reference_us / ours_us >= MIN_SPEEDUP, (ours_us, reference_us)


def test_header_reply_build_and_serialise_is_much_faster_than_reference_serialise():
    reference_reply = ref.ProcessingResponse.parse(header_reply().SerializeToString())
    ours_us = per_call_us(lambda: header_reply().SerializeToString(), 2000)
    reference_us = per_call_us(lambda: bytes(reference_reply), 100)
    assert reference_us / ours_us >= MIN_SPEEDUP, (ours_us, reference_us)
