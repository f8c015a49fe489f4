"""The EPP counts the disaggregation decision of every dispatched request,
with the reference's metric names, when its profile handler disaggregates."""

from epp.flowcontrol.outcome import Outcome
from epp.flowcontrol.request import FlowRequest
from epp.scheduling.profiles import PREFILLER_HEADER, disagg_profile_handler, single_profile_handler
from epp.scheduling.request import InferenceRequest
from epp.scheduling.spec import PluginSpec
from epp.serve.metrics import EppMetrics, StageView
from tests.support.metrics_page import MetricsPage


def dispatched(routing=None) -> FlowRequest:
    payload = InferenceRequest("m", "target", routing=routing)
    request = FlowRequest("r", "f", 0, 0.0, payload=payload)
    request.outcome = Outcome.DISPATCHED
    return request


DISAGG = PluginSpec("pd", disagg_profile_handler, type="disagg-profile-handler")


def decisions(metrics: EppMetrics, name: str) -> dict[str, float]:
    return MetricsPage.parse(metrics.exposition()).by_label("decision_type", f"{name}_total")


def test_each_dispatched_request_counts_its_decision_under_a_disagg_handler():
    metrics = EppMetrics("pool")
    metrics.watch_scheduling(DISAGG)
    metrics.on_outcome(dispatched({PREFILLER_HEADER: "10.0.0.1:8000"}), 1.0)
    metrics.on_outcome(dispatched(), 1.0)
    metrics.on_outcome(dispatched(), 1.0)
    expected = {"prefill-decode": 1.0, "decode-only": 2.0}
    assert decisions(metrics, "llm_d_epp_disagg_decision") == expected
    assert decisions(metrics, "llm_d_inference_scheduler_disagg_decision") == expected


def test_decisions_carry_the_handler_name_and_type_as_configured():
    metrics = EppMetrics("pool")
    metrics.watch_scheduling(DISAGG)
    metrics.on_outcome(dispatched(), 1.0)
    page = MetricsPage.parse(metrics.exposition())
    labels = [sample.labels for sample in page.series("llm_d_epp_disagg_decision_total")]
    assert labels[0]["plugin_name"] == "pd"
    assert labels[0]["plugin_type"] == "disagg-profile-handler"


def test_no_decisions_are_counted_without_a_disagg_handler():
    metrics = EppMetrics("pool")
    metrics.watch_scheduling(PluginSpec("single-profile-handler", single_profile_handler))
    metrics.on_outcome(dispatched(), 1.0)
    assert decisions(metrics, "llm_d_epp_disagg_decision") == {}


def test_credits_in_use_are_reported_per_stage():
    metrics = EppMetrics("pool")
    metrics.watch_credits(lambda: {"decode": 3, "prefill": 1})
    page = MetricsPage.parse(metrics.exposition())
    found = page.by_label("stage", "epp_flow_control_credits_in_use")
    assert found == {"decode": 3.0, "prefill": 1.0}


def test_saturation_is_reported_per_stage_beside_the_effective_one():
    metrics = EppMetrics("pool")
    view = StageView(
        saturation=lambda: {"decode": 0.5, "prefill": 1.25},
        stale=lambda: ("saturation-filter", 2),
        queued=lambda: {"decode": 0, "prefill": 3, "effective": 0},
    )
    metrics.watch_core(lambda: 0.75, view)
    value = metrics.registry.get_sample_value
    for name in ("llm_d_epp_flow_control_pool_saturation",
                 "inference_extension_flow_control_pool_saturation"):  # fmt: skip
        readings = {
            stage: value(name, {"inference_pool": "pool", "stage": stage})
            for stage in ("effective", "decode", "prefill")
        }
        assert readings == {"effective": 0.75, "decode": 0.5, "prefill": 1.25}
    stale = value("llm_d_epp_flow_control_stale_endpoints", {"detector": "saturation-filter"})
    assert stale == 2
    by_stage = "epp_flow_control_queue_size_by_stage"
    assert value(by_stage, {"inference_pool": "pool", "stage": "prefill"}) == 3
    assert value(by_stage, {"inference_pool": "pool", "stage": "decode"}) == 0
