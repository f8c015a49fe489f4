"""Prefill/decode disaggregation through a real Envoy: `epp serve` with the
reference's P/D sample configuration, two stand-in model servers labelled
`llm-d.ai/role: prefill` and `decode` (the file-discovery format of
`--endpoints @FILE`). A long uncached prompt goes to the decode server with
the prefill server in `x-prefiller-host-port`, as the decode pod's sidecar
expects; the same prompt again is cached there and goes without. The EPP's
pool saturation reads each stage."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.envoy import running_envoy
from tests.support.epp_process import running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy]

SAMPLE = Path(__file__).parents[1] / "data" / "reference_configs" / "sim-pd-epp-config.yaml"


def endpoints_file(folder: Path, prefill: str, decode: str) -> Path:
    entries = []
    for name, address, role in (("prefill", prefill, "prefill"), ("decode", decode, "decode")):
        host, port = address.rsplit(":", 1)
        entries.append(
            {"name": name, "address": host, "port": port, "labels": {"llm-d.ai/role": role}}
        )
    path = folder / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"endpoints": entries}))
    return path


async def test_a_long_prompt_is_prefilled_elsewhere_and_the_decode_pod_is_told(tmp_path) -> None:
    async with running_fake_vllm() as prefill, running_fake_vllm() as decode:
        prefill.release.set()
        decode.release.set()
        endpoints = endpoints_file(tmp_path, prefill.address, decode.address)
        async with (
            running_epp(
                f"--config-file={SAMPLE}",
                f"--endpoints=@{endpoints}",
                "--pool-name=e2e-pool",
            ) as epp,
            running_envoy(epp_port=epp.ports["grpc"]) as envoy,
            aiohttp.ClientSession() as session,
        ):
            url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
            body = json.dumps({"model": "m", "prompt": "a long document " * 100}).encode()
            for _ in range(2):
                async with session.post(url, data=body) as response:
                    assert response.status == 200, await response.text()
            async with session.get(epp.metrics_url) as response:
                metrics = await response.text()
    assert prefill.received == []
    stages = {
        sample.labels["stage"]
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "llm_d_epp_flow_control_pool_saturation"
    }
    assert stages == {"effective", "decode", "prefill"}
    first, second = ({k.lower(): v for k, v in r["headers"].items()} for r in decode.received)
    assert first.get("x-prefiller-host-port") == prefill.address
    assert "x-prefiller-host-port" not in second
