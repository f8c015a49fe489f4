"""The load generator's client timeout outlasts the longest the EPP may keep
a request queued plus its service, so a request that waits out its TTL ends
with the EPP's expiry live, as it does in the simulator."""

from __future__ import annotations

from pathlib import Path

from epp.demo.demo import DRAIN_TIMEOUT_S, client_timeout
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import Arrived

TENANT = {
    "name": "a",
    "objective": "o",
    "rate_rps": 1,
    "prompt_tokens": {"constant": 1000},
    "output_tokens": {"constant": 100},
}
POOL = {
    "servers": 2,
    "max_num_seqs": 10,
    "prefill_ms_per_token": 1.0,
    "prefill_overhead_ms": 0.0,
    "decode_ms_per_token": 10.0,
    "decode_batch_growth": 0.1,
}
SERVICE_S = (1000 * 1.0 + 100 * 10.0 * (1 + 0.1 * 10)) / 1000  # 3 s


def scenario(tmp_path: Path, ttl: str, **tenant):
    config = tmp_path / "epp.yaml"
    config.write_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        f"flowControl: {{defaultRequestTTL: {ttl}}}\n"
    )
    return parse_scenario(
        {
            "name": "t",
            "duration_s": 30,
            "drain_s": 90,
            "pool": POOL,
            "objectives": [{"name": "o"}],
            "tenants": [{**TENANT, **tenant}],
            "epp": {"config": str(config)},
        }
    )


ARRIVALS = [Arrived(0.0, 0, 1000, 100)]


def test_the_timeout_is_the_default_ttl_plus_the_longest_service_and_room(tmp_path) -> None:
    timeout = client_timeout(scenario(tmp_path, "60s"), ARRIVALS)
    assert timeout == 60 + SERVICE_S + DRAIN_TIMEOUT_S


def test_a_shorter_request_ttl_shortens_the_wait(tmp_path) -> None:
    timeout = client_timeout(scenario(tmp_path, "60s", ttl_s=5), ARRIVALS)
    assert timeout == 5 + SERVICE_S + DRAIN_TIMEOUT_S


def test_without_any_ttl_the_wait_is_the_simulators_horizon(tmp_path) -> None:
    timeout = client_timeout(scenario(tmp_path, "0s"), ARRIVALS)
    assert timeout == 30 + 90 + SERVICE_S + DRAIN_TIMEOUT_S
