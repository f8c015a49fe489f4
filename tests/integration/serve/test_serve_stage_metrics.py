"""EppServer in process over a P/D pool: the saturation per stage, the stale
endpoints and the queue by the stage that holds it, read from /metrics text."""

from __future__ import annotations

from epp.flowcontrol.request import FlowRequest
from epp.scheduling.request import InferenceRequest
from epp.serve.server import EppServer, ServeOptions
from tests.support.disagg import disagg_config
from tests.support.metrics_page import MetricsPage

CONFIG = disagg_config("{kinds: [concurrency], maxPerEndpoint: 8, maxPerPrefillEndpoint: 1}")
ENDPOINTS = """\
endpoints:
- {name: d, address: 10.0.0.1, port: '8000', labels: {llm-d.ai/role: decode}}
- {name: p, address: 10.0.0.2, port: '8000', labels: {llm-d.ai/role: prefill}}
"""


async def test_requests_waiting_for_the_prefill_stage_are_counted_under_it(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "endpoints.yaml").write_text(ENDPOINTS)
    server = EppServer(
        ServeOptions(
            config_file=str(tmp_path / "config.yaml"),
            pool_name="pd-pool",
            endpoints=f"@{tmp_path / 'endpoints.yaml'}",
        )
    )
    payload = InferenceRequest("m", "m", prompt="p" * 400, input_tokens=100)
    requests = [FlowRequest(str(n), "t", 0, 0.0, payload=payload) for n in range(3)]
    outcomes = [server.admission.offer(request) for request in requests]
    assert outcomes[0] is not None and outcomes[0].is_dispatched
    assert outcomes[1:] == [None, None]  # the prefill endpoint's one credit is taken

    page = MetricsPage.parse(server.metrics.exposition())
    queued = page.by_label("stage", "epp_flow_control_queue_size_by_stage")
    assert queued == {"decode": 0, "prefill": 2, "effective": 0}
    saturation = page.by_label("stage", "llm_d_epp_flow_control_pool_saturation")
    assert set(saturation) == {"effective", "decode", "prefill"}
    assert saturation["decode"] == saturation["prefill"] == 1.0  # never scraped: stale
    stale = page.by_label("detector", "llm_d_epp_flow_control_stale_endpoints")
    assert stale == {"saturation-filter": 2}
