"""The reference's Grafana dashboards and alert rules against epp's
`/metrics` under mixed-priority load behind a real Envoy: every query's EPP
series is emitted, with a sample its label matchers accept and the labels
it groups and joins on. Only queries for plugins epp refuses are left out,
by name (`REFUSED`)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio

from tests.support.dashboards import Page, read_page, reference_queries, unmet
from tests.support.envoy import running_envoy
from tests.support.epp_process import objectives_yaml, running_epp
from tests.support.fake_vllm import running_fake_vllm

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  priorityBands:
  - priority: -1
    maxRequests: 1
  gate:
    kinds: [concurrency]
    maxPerEndpoint: 1
"""
PRECISE = (
    "the precise prefix cache, which this load does not configure: "
    "tests/e2e/test_precise_prefix_envoy.py checks them under precise routing"
)
REFUSED = {
    ("llm-d_guides_epp_panels.yaml", alert): PRECISE
    for alert in (
        "KVCacheIndexMetricsAbsent",
        "KVCacheIndexNotAdmitting",
        "KVCachePrefixHitRateLow",
        "KVCacheIndexHighLookupLatency",
        "KVCacheIndexEvictionSpike",
        "KVCacheEventsSubscriberReconnecting",
        "KVCacheEventsZMQErrors",
        "KVCacheEventsStalled",
        "KVCacheTokenizationSlow",
    )
}
REFUSED["llm-d_guides_epp_panels.yaml", "KVCacheEventsPoolBacklog"] = (
    "the reference's KV-event worker pool's queue depth: epp has no such pool, it applies "
    "each message as it reads it"
)


async def mixed_priority_load(url: str, epp, upstreams) -> None:
    """Queued requests of three priorities and several tenants, a full
    sheddable band, a bad request and a model server's 404."""
    async with aiohttp.ClientSession() as session:

        async def post(objective: str, tenant: str, prompt: str = "p", body: bytes | None = None):
            headers = {
                "x-llm-d-inference-objective": objective,
                "x-llm-d-inference-fairness-id": tenant,
            }
            data = body or json.dumps({"model": "m", "prompt": prompt}).encode()
            async with session.post(url, data=data, headers=headers) as response:
                await response.read()
                return response.status

        held = [
            asyncio.create_task(post(objective, tenant, "hold"))
            for objective, tenant in (
                ("high", "t1"), ("mid", "t2"), ("high", "t2"), ("mid", "t1"), ("low", "t3"),
            )
        ]  # fmt: skip
        await epp.wait_queued(session, 3)
        statuses = [await post("low", "t4")]  # the sheddable band holds one: 429
        for upstream in upstreams:
            upstream.release.set()
        statuses += await asyncio.gather(*held)
        statuses.append(await post("high", "t1", body=b"{not json"))
        for upstream in upstreams:
            upstream.status = 404
        statuses.append(await post("mid", "t2"))
        for upstream in upstreams:
            upstream.status = 200
    assert sorted(statuses) == [200] * 5 + [400, 404, 429], statuses


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def page(tmp_path_factory) -> Page:
    """The EPP's `/metrics` after the load."""
    folder = tmp_path_factory.mktemp("dashboards")
    (folder / "config.yaml").write_text(CONFIG)
    (folder / "objectives.yaml").write_text(objectives_yaml("pool", high=10, mid=0, low=-1))
    async with (
        running_fake_vllm() as first,
        running_fake_vllm() as second,
        running_epp(
            f"--config-file={folder / 'config.yaml'}",
            f"--objectives={folder / 'objectives.yaml'}",
            "--pool-name=pool",
            f"--endpoints={first.address},{second.address}",
        ) as epp,
        running_envoy(epp_port=epp.ports["grpc"]) as envoy,
    ):
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
        await mixed_priority_load(url, epp, (first, second))
        async with aiohttp.ClientSession() as session, session.get(epp.metrics_url) as reply:
            return read_page(await reply.text())


async def test_every_reference_panel_and_alert_reads_series_epp_emits(page):
    failures = {}
    checked = set()
    for query in reference_queries():
        if (query.source, query.panel) in REFUSED:
            continue
        for selector in query.epp_selectors():
            checked.add((query.source, query.panel))
            missing = unmet(selector, page)
            if missing:
                failures.setdefault(f"{query.source}: {query.panel}", set()).update(missing)
    assert not failures, "\n".join(f"{panel}: {sorted(why)}" for panel, why in failures.items())
    assert len(checked) >= 50


async def test_errors_under_load_read_the_references_codes(page):
    codes = {labels["error_code"]: labels for labels in page["llm_d_epp_request_error_total"]}
    assert set(codes) == {"BadRequest", "ResourceExhausted", "ModelServerError"}
    assert codes["ModelServerError"]["priority"] == "0"  # the mid objective's 404
