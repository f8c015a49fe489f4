"""Fallback endpoints through a real Envoy: with `maxNumOfEndpoints: 2` the
EPP lists the destination and a fallback in `x-gateway-destination-endpoint`;
an Envoy whose pool cluster uses the `override_host` load-balancing policy
(which reads that list) sends the request to the destination, and on its
failure retries the listed fallback. (The shipped Envoy configuration's
ORIGINAL_DST cluster reads a single address.)"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.envoy import CONFIG_DIR, running_envoy
from tests.support.epp_process import running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy]

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-label-affinity-scorer
  parameters: {headerName: x-zone, labelKey: zone}
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-label-affinity-scorer
  - pluginRef: max-score-picker
"""

OVERRIDE_HOST_POOL = """\
  - name: inference_pool
    type: STATIC
    connect_timeout: 10s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
    load_assignment:
      cluster_name: inference_pool
      endpoints:
      - lb_endpoints:
{endpoints}
"""  # noqa: E501 (Envoy's type URLs)


def override_host_template(folder: Path, *addresses: str) -> Path:
    """The shipped Envoy template with its pool cluster listing `addresses`
    under the override_host policy, and one retry on a 5xx."""
    text = (CONFIG_DIR / "envoy.yaml").read_text()
    start = text.index("  - name: inference_pool\n")
    end = text.index("  - name: epp\n")
    endpoints = "\n".join(
        f"        - endpoint: {{address: {{socket_address: "
        f"{{address: {host}, port_value: {port}}}}}}}"
        for host, port in (address.rsplit(":", 1) for address in addresses)
    )
    text = text[:start] + OVERRIDE_HOST_POOL.replace("{endpoints}", endpoints) + text[end:]
    route = "                  cluster: inference_pool\n"
    assert route in text
    text = text.replace(
        route, route + '                  retry_policy: {retry_on: "5xx", num_retries: 1}\n'
    )
    path = folder / "envoy-override-host.yaml"
    path.write_text(text)
    return path


def endpoints_file(folder: Path, zones: dict[str, str]) -> Path:
    entries = []
    for index, (address, zone) in enumerate(zones.items()):
        host, port = address.rsplit(":", 1)
        entries.append(
            {"name": f"s{index}", "address": host, "port": port, "labels": {"zone": zone}}
        )
    path = folder / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"endpoints": entries}))
    return path


async def test_envoy_retries_the_listed_fallback_when_the_destination_fails(tmp_path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    async with running_fake_vllm() as failing, running_fake_vllm() as fallback:
        failing.status = 503
        endpoints = endpoints_file(tmp_path, {failing.address: "a", fallback.address: "b"})
        async with (
            running_epp(
                f"--config-file={config}",
                f"--endpoints=@{endpoints}",
                "--allow-experimental-plugins",
            ) as epp,
            running_envoy(
                epp_port=epp.ports["grpc"],
                template=override_host_template(tmp_path, failing.address, fallback.address),
            ) as envoy,
            aiohttp.ClientSession() as session,
        ):
            url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
            body = json.dumps({"model": "m", "prompt": "hello"}).encode()
            async with session.post(url, data=body, headers={"x-zone": "a"}) as response:
                text = await response.text()
    assert response.status == 200, text
    assert json.loads(text)["served_by"] == fallback.address
    listed = f"{failing.address},{fallback.address}"
    assert [r["destination"] for r in failing.received] == [listed]
