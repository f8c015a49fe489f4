"""Reliability through the real Envoy, small versions of bench/reliability.py's cases.

Each case starts its own stack (simulated servers, `epp serve`, Envoy) and
stops it."""

from __future__ import annotations

import pytest

from bench.reliability import (
    HANDLED_MALFORMED,
    disconnect_while_queued,
    epp_restart,
    malformed_input,
    server_killed,
    soak,
)

pytestmark = [pytest.mark.envoy]


def no_loss_no_crash(result) -> None:
    assert result.lost == 0, result.details
    assert result.epp_crashes == 0, result.details
    assert result.answered == result.sent


async def test_server_killed_mid_load_every_request_ends_with_a_response(tmp_path):
    result = await server_killed(tmp_path, rate=30.0, duration=4.0)
    no_loss_no_crash(result)
    assert not [
        o for o in result.details["outcomes"] if o.startswith("error") and "Payload" not in o
    ]


async def test_server_killed_new_requests_avoid_the_dead_endpoint(tmp_path):
    result = await server_killed(tmp_path, rate=30.0, duration=4.0)
    assert result.details["sent_after_kill_window"] > 0
    assert result.details["failed_after_kill_window"] == 0, result.details


async def test_thousand_clients_disconnecting_while_queued_leave_nothing_behind(tmp_path):
    result = await disconnect_while_queued(tmp_path, clients=1000, holder_tokens=600)
    assert result.details["peak_queued"] >= 1000
    assert result.details["drained"], result.details
    assert result.lost == 0
    assert result.epp_crashes == 0


async def test_thousand_clients_disconnecting_while_queued_empty_the_queue(tmp_path):
    result = await disconnect_while_queued(tmp_path, clients=1000, holder_tokens=600)
    assert result.details["peak_queued"] >= 1000
    assert result.details["final_queued"] == 0
    assert result.epp_crashes == 0


async def test_malformed_input_is_answered_400_or_413_and_the_epp_survives(tmp_path):
    result = await malformed_input(tmp_path, header_count=5000, request_timeout=5.0)
    assert result.epp_crashes == 0
    assert result.lost == 0, result.details
    assert not result.details["unhandled"], result.details
    assert result.details["good_request_after"] == 200


async def test_malformed_input_short_of_deep_nesting_is_answered_400(tmp_path):
    result = await malformed_input(tmp_path, header_count=0, deep_nesting=False, large_valid=False)
    statuses = result.details["statuses"]
    assert result.epp_crashes == 0
    assert set(statuses.values()) <= HANDLED_MALFORMED, statuses
    assert result.details["good_request_after"] == 200


async def test_epp_restarted_under_load_fails_closed_then_recovers(tmp_path):
    result = await epp_restart(tmp_path, rate=30.0, duration=10.0, down_s=1.0)
    no_loss_no_crash(result)
    during = result.details["statuses_during_outage"]
    # Envoy holds a request while it reconnects to the EPP: those sent late in
    # the outage are served once it is back; the others fail closed with a 5xx.
    assert any(int(status) >= 500 for status in during), during
    assert all(int(status) >= 500 or int(status) == 200 for status in during), during
    assert result.details["sent_after_recovery"] > 0
    assert result.details["failed_after_recovery"] == 0, result.details


async def test_short_soak_keeps_epp_memory_within_ten_percent(tmp_path):
    result = await soak(tmp_path, rate=30.0, duration=6.0, warmup=3.0)
    no_loss_no_crash(result)
    assert result.memory_growth < 0.10, result.details
