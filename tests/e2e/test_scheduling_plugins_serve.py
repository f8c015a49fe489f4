"""Scheduling plugins served for real (simulated model servers, `epp serve`
and Envoy on loopback): the load-reading plugins answer a chat request, and
a profile whose filters keep no pod answers 429 `rejected-saturated`, as
the reference does."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.demo.stack import StackSettings
from tests.support.chat import chat_through_envoy

pytestmark = [pytest.mark.envoy]

LOAD_PLUGINS = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-affinity-filter
- type: utilization-filter
  parameters:
    conditions:
    - metric: active-requests
      maxValue: 100
- type: token-load-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: utilization-filter
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: token-load-scorer
  - pluginRef: prefix-cache-scorer
"""

NOTHING_MATCHES = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-selector-filter
  parameters:
    matchLabels: {tier: none-has-it}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
"""


async def chat(config: Path) -> tuple[int, str, str | None]:
    return await chat_through_envoy(
        StackSettings(servers=2, epp_config=str(config), epp_args=("--allow-experimental-plugins",))
    )


async def test_the_load_reading_plugins_serve_a_chat_request(tmp_path: Path) -> None:
    config = tmp_path / "load.yaml"
    config.write_text(LOAD_PLUGINS)
    status, text, _ = await chat(config)
    assert status == 200, text


async def test_filters_keeping_no_pod_answer_429_rejected_saturated(tmp_path: Path) -> None:
    config = tmp_path / "nothing.yaml"
    config.write_text(NOTHING_MATCHES)
    status, text, reason = await chat(config)
    assert (status, reason) == (429, "rejected-saturated"), text
