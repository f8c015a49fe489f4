"""The flow-control plugins of a configuration reach the live server: the
reference's probabilistic-admitter sample (the admitter decides, the
utilization detector is neutered) and a concurrency detector as the gate."""

from __future__ import annotations

from pathlib import Path

from epp.flowcontrol.request import FlowRequest
from epp.scheduling.detectors import ConcurrencyDetector, DetectorGate, UtilizationDetector
from epp.scheduling.saturation import SaturationThresholds
from epp.serve.server import EppServer
from tests.support.serving import loopback_options

SAMPLE = Path(__file__).parents[2] / "data/reference_configs/probabilistic-admitter-epp-config.yaml"


def server(config_text: str) -> EppServer:
    # The endpoints are never scraped here: no metrics, so each counts saturated.
    return EppServer(loopback_options(config_text=config_text, endpoints="127.0.0.1:1,127.0.0.1:2"))


def test_the_admitter_sample_sheds_sheddable_requests_on_a_saturated_pool() -> None:
    live = server(SAMPLE.read_text())
    assert live.service.screen == live.admission.screen
    sheddable = FlowRequest("r1", "f", -1, 0.0)
    assert (
        live.admission.screen(sheddable)
        == "probabilistic-admitter: rejected, saturation=1.000 prob=1.00"
    )
    assert live.admission.screen(FlowRequest("r2", "f", 0, 0.0)) is None


def test_the_admitter_sample_neuters_the_utilization_detector_gate() -> None:
    live = server(SAMPLE.read_text())
    assert isinstance(live.core.gate, DetectorGate)
    thresholds = SaturationThresholds(999999999, 1.0, 0.2)
    assert live.core.gate.detector == UtilizationDetector(thresholds, 0.0)


def test_a_concurrency_detector_is_the_gate_and_the_saturation_gauge() -> None:
    live = server(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: concurrency-detector\n  parameters: {maxConcurrency: 2}\n"
        "flowControl:\n  saturationDetector: {pluginRef: concurrency-detector}\n"
    )
    assert isinstance(live.core.gate, DetectorGate) and live.core.credits is live.core.gate
    assert live.core.gate.detector == ConcurrencyDetector(max_concurrency=2)
    request = FlowRequest("r", "f", 0, 0.0)
    request.endpoint = "127.0.0.1:1"
    live.core.gate.on_dispatch(request)
    assert live.core.saturation() == 0.25


HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_a_reload_applies_admitters_at_once_and_eviction_at_the_next_restart(tmp_path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(HEAD)
    live = EppServer(loopback_options(config_file=str(path), endpoints="127.0.0.1:1"))
    assert live.core.evictor is None
    path.write_text(
        HEAD + "plugins: [{type: probabilistic-admitter}]\nflowControl: {enableEviction: true}\n"
    )
    live.reload_config()
    assert live.config.flow_plugins.eviction is None and live.core.evictor is None
    assert live.admission.screen(FlowRequest("r", "f", -1, 0.0)) is not None
