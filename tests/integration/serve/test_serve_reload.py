"""EppServer in process: file changes reload, invalid changes are refused and
the last good state stays, queued requests survive every reload."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from epp.flowcontrol.request import FlowRequest, State
from epp.scheduling.request import InferenceRequest
from epp.serve.inputs import StartupError, read_endpoints
from epp.serve.server import EppServer, ServeOptions
from tests.support.disagg import disagg_config

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate: {{kinds: [concurrency], maxPerEndpoint: 1}}
  defaultPriorityBand: {{maxRequests: {max_requests}}}
"""
OBJECTIVE = """\
apiVersion: llm-d.ai/v1
kind: InferenceObjective
metadata: {{name: gold, namespace: default}}
spec:
  priority: {priority}
  poolRefs: [{{name: reload-pool}}]
"""
GOLD = {"x-llm-d-inference-objective": "gold"}


def write(path: Path, text: str) -> None:
    """Replace the file with a visibly newer one (mtime granularity is coarse)."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000))


@pytest.fixture
def files(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(max_requests=10))
    objectives = tmp_path / "objectives"
    objectives.mkdir()
    (objectives / "gold.yaml").write_text(OBJECTIVE.format(priority=5))
    endpoints = tmp_path / "endpoints.txt"
    endpoints.write_text("10.0.0.1:8000\n")
    return config, objectives, endpoints


@pytest.fixture
def server(files):
    config, objectives, endpoints = files
    return EppServer(
        ServeOptions(
            config_file=str(config),
            objectives=(str(objectives),),
            pool_name="reload-pool",
            endpoints=f"@{endpoints}",
        )
    )


def queue_one(server: EppServer, name: str) -> FlowRequest:
    request = FlowRequest(name, "tenant", server.priority_of(GOLD), arrival=0.0, byte_size=10)
    assert server.core.controller.enqueue(request, 0.0) is None
    return request


def test_objective_priority_change_applies_to_new_requests(server, files):
    _, objectives, _ = files
    server.watch_files()
    write(objectives / "gold.yaml", OBJECTIVE.format(priority=9))
    server.watcher.check()
    assert server.priority_of(GOLD) == 9


def test_objective_added_to_a_watched_folder_is_loaded(server, files):
    _, objectives, _ = files
    server.watch_files()
    (objectives / "silver.yaml").write_text(
        OBJECTIVE.format(priority=3).replace("name: gold", "name: silver")
    )
    server.watcher.check()
    assert server.priority_of({"x-llm-d-inference-objective": "silver"}) == 3


def test_invalid_objectives_are_refused_with_file_document_and_field(server, files, caplog):
    _, objectives, _ = files
    server.watch_files()
    write(objectives / "gold.yaml", OBJECTIVE.format(priority='"high"'))
    with caplog.at_level(logging.ERROR):
        server.watcher.check()
    assert server.priority_of(GOLD) == 5
    assert f"{objectives / 'gold.yaml'}[0]" in caplog.text
    assert "spec.priority" in caplog.text
    assert server.watcher.refusals == 1


async def test_config_change_keeps_queued_requests_and_applies_new_limits(server, files):
    # async: the EPP's hooks run in its event loop
    config, _, _ = files
    server.watch_files()
    requests = [queue_one(server, f"r{i}") for i in range(4)]
    write(config, CONFIG.format(max_requests=3))
    server.watcher.check()
    assert server.watcher.reloads == 1
    assert [r.state for r in requests] == [State.DISPATCHED] + [State.QUEUED] * 3
    assert server.core.controller.enqueue(FlowRequest("r5", "tenant", 5, 0.0), 0.0) is not None


def test_invalid_config_is_refused_and_the_old_one_stays(server, files, caplog):
    config, _, _ = files
    server.watch_files()
    write(config, CONFIG.format(max_requests="many"))
    with caplog.at_level(logging.ERROR):
        server.watcher.check()
    assert "flowControl.defaultPriorityBand.maxRequests" in caplog.text
    assert server.config.flow_control.default_band.max_requests == 10


def test_endpoints_file_change_replaces_the_pool(server, files):
    _, _, endpoints = files
    server.watch_files()
    write(endpoints, "10.0.0.2:8000, 10.0.0.3:8000\n")
    server.watcher.check()
    assert sorted(server.store.addresses()) == ["10.0.0.2:8000", "10.0.0.3:8000"]


def test_invalid_endpoints_file_keeps_the_last_good_pool(server, files):
    _, _, endpoints = files
    server.watch_files()
    write(endpoints, "10.0.0.2:notaport\n")
    server.watcher.check()
    assert server.store.addresses() == ["10.0.0.1:8000"]


def test_without_objectives_or_pool_the_shipped_samples_apply():
    server = EppServer(ServeOptions(endpoints="10.0.0.1:8000"))
    assert server.priority_of({"x-llm-d-inference-objective": "premium"}) == 10
    assert server.priority_of({"x-llm-d-inference-objective": "batch"}) == -5


def test_objectives_apply_to_a_pool_synthesised_from_pool_name(files):
    _, objectives, _ = files
    server = EppServer(
        ServeOptions(objectives=(str(objectives),), pool_name="other", endpoints="10.0.0.1:80")
    )
    assert server.priority_of(GOLD) == 0


def test_file_mode_without_endpoints_is_a_startup_error():
    with pytest.raises(StartupError, match="--endpoints"):
        EppServer(ServeOptions())


def test_shipped_defaults_are_the_config_samples():
    root = Path(__file__).resolve().parents[3]
    for name in ("objectives.yaml", "pool.yaml"):
        shipped = (root / "epp" / "defaults" / name).read_text()
        assert shipped == (root / "config" / "samples" / name).read_text()


@pytest.mark.parametrize(
    ("text", "addresses"),
    [
        ("10.0.0.1:80,10.0.0.2:80", ["10.0.0.1:80", "10.0.0.2:80"]),
        ("", []),
    ],
)
def test_inline_endpoint_lists(text, addresses):
    assert [spec.address for spec in read_endpoints(text)] == addresses


def test_endpoint_file_allows_lines_and_comments(tmp_path):
    path = tmp_path / "endpoints"
    path.write_text("# pool\n10.0.0.1:80\n10.0.0.2:80  # second\n")
    assert [spec.address for spec in read_endpoints(f"@{path}")] == ["10.0.0.1:80", "10.0.0.2:80"]


def test_an_endpoint_file_may_be_an_endpoints_document_with_labels(tmp_path):
    path = tmp_path / "endpoints.yaml"
    path.write_text(
        "# pool\nendpoints:\n  - name: a\n    address: 10.0.0.1\n    port: '80'\n"
        "    labels: {llm-d.ai/engine-type: trtllm-serve}\n"
    )
    [spec] = read_endpoints(f"@{path}")
    assert (spec.name, spec.address) == ("a", "10.0.0.1:80")
    assert spec.labels == {"llm-d.ai/engine-type": "trtllm-serve"}


PD_CONFIG = disagg_config(
    "{kinds: [concurrency], maxPerEndpoint: 4, maxPerPrefillEndpoint: 2, prefillTimeout: 7s}"
)
SINGLE_CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl:
  gate: {kinds: [concurrency], maxPerEndpoint: 4, maxPerPrefillEndpoint: 2, prefillTimeout: 7s}
"""
ROLES = """\
endpoints:
- {name: d, address: 10.0.0.1, port: '8000', labels: {llm-d.ai/role: decode}}
- {name: p, address: 10.0.0.2, port: '8000', labels: {llm-d.ai/role: prefill}}
"""


def pd_request(name: str) -> FlowRequest:
    payload = InferenceRequest("m", "m", prompt="p" * 400, input_tokens=100)
    return FlowRequest(name, "tenant", 0, arrival=0.0, byte_size=10, payload=payload)


async def test_a_reload_that_turns_disaggregation_on_bounds_and_times_the_prefill_stage(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(SINGLE_CONFIG)
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(ROLES)
    server = EppServer(
        ServeOptions(config_file=str(config), pool_name="pd-pool", endpoints=f"@{endpoints}")
    )
    assert server.core.prefill_credits is None
    server.watch_files()
    write(config, PD_CONFIG)
    server.watcher.check()
    assert server.core.prefill_timeout == 7.0
    outcomes = [server.admission.offer(pd_request(str(n))) for n in range(3)]
    assert [o is not None and o.is_dispatched for o in outcomes] == [True, True, False]
    assert server.core.prefill_credits is not None
    assert server.core.prefill_credits.in_flight_at("10.0.0.2:8000") == 2  # its two credits
    assert server.core.in_prefill == 2


def test_a_reload_turns_priority_propagation_on_and_off(server, files):
    config, _, _ = files
    server.watch_files()
    assert server.service.settings.priority_in_body is None
    on = CONFIG.format(max_requests=10) + "requestHandler: {propagatePriority: true}\n"
    write(config, on)
    server.watcher.check()
    priority_in_body = server.service.settings.priority_in_body
    request = FlowRequest("r", "f", 5, 0.0)
    request.endpoint = "10.0.0.1:8000"  # unlabelled: the priority as it is
    assert priority_in_body is not None and priority_in_body(request) == 5
    write(config, CONFIG.format(max_requests=10))
    server.watcher.check()
    assert server.service.settings.priority_in_body is None


def test_a_reload_that_adds_the_models_responder_waits_for_a_restart(files, caplog):
    config, objectives, endpoints = files
    server = EppServer(
        ServeOptions(
            config_file=str(config),
            objectives=(str(objectives),),
            pool_name="reload-pool",
            endpoints=f"@{endpoints}",
            allow_experimental_plugins=True,  # models-responder is alpha
        )
    )
    server.watch_files()
    added = CONFIG.format(max_requests=10) + "plugins: [{type: models-responder}]\n"
    write(config, added)
    with caplog.at_level(logging.WARNING):
        server.watcher.check()
    assert server.config.models is None
    assert "models-responder changes apply at the next restart" in caplog.text
