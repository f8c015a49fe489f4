from __future__ import annotations

import io
from pathlib import Path

import pytest

from epp.cli import main
from epp.config.validate_command import validate

ROOT = Path(__file__).parents[3]

BAD = """\
apiVersion: llm-d.ai/v1
kind: InferenceObjective
metadata: {name: ok}
spec: {poolRefs: [{name: pool}]}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceObjective
metadata: {name: broken}
spec:
  priority: 5000000000
  poolSelector: {}
---
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
flowControl: {defaultRequestTTL: soon}
"""


def run(*paths: Path | str, allow_experimental_plugins: bool = False) -> tuple[bool, list[str]]:
    out = io.StringIO()
    status = validate([str(path) for path in paths], out, allow_experimental_plugins)
    return status == 0, out.getvalue().splitlines()


@pytest.mark.parametrize(
    "path",
    [
        "config/samples/pool.yaml",
        "config/samples/objectives.yaml",
        "config/samples/multi-pool-objective.yaml",
        "config/epp/default.yaml",
        "config/epp/disaggregated.yaml",
        "config/epp/data-parallel.yaml",
    ],
)
def test_shipped_file_is_valid(path: str) -> None:
    valid, lines = run(ROOT / path)
    assert valid, lines


@pytest.mark.parametrize(
    "path", ["config/epp/header-profile.yaml", "config/epp/session-affinity.yaml"]
)
def test_shipped_file_with_alpha_plugins_is_valid_with_the_serve_flag(path: str) -> None:
    valid, lines = run(ROOT / path, allow_experimental_plugins=True)
    assert valid, lines


def test_each_error_names_file_document_field_and_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    valid, lines = run(path)
    assert not valid
    assert lines[:-1] == [
        f"{path}[1]: spec.priority: Invalid value: 5000000000: "
        'spec.priority in body must be of type int32: "5000000000"',
        f'{path}[1]: spec.poolSelector: Invalid value: "object": poolSelector must not be empty',
        f"{path}[2]: flowControl.defaultRequestTTL: invalid duration 'soon'; "
        'use e.g. "60s", "500ms", "1m30s"',
    ]
    assert lines[-1] == "3 documents checked, 3 errors"


def test_unknown_kind_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    valid, lines = run(path)
    assert not valid
    assert lines[0].startswith(f'{path}[0]: kind: Invalid value: "Service"')


def test_unreadable_file_does_not_stop_the_others(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [\n")
    valid, lines = run(broken, tmp_path / "missing.yaml", ROOT / "config/samples/pool.yaml")
    assert not valid
    assert lines[0].startswith(f"{broken}: invalid YAML")
    assert lines[1] == f"{tmp_path / 'missing.yaml'}: no such file or directory"
    assert lines[-1] == "1 documents checked, 2 errors"


def test_folder_is_expanded(tmp_path: Path) -> None:
    valid, lines = run(ROOT / "config" / "samples")
    assert valid
    assert lines[-1] == "5 documents checked, 0 errors"


def test_exit_status_is_zero_when_valid_and_one_otherwise(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    assert main(["validate", str(ROOT / "config" / "samples")]) == 0
    assert main(["validate", str(bad)]) == 1


def test_an_unsupported_plugin_exits_two_naming_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(
        "apiVersion: llm-d.ai/v1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: predicted-latency-producer\n"
    )
    assert main(["validate", str(path)]) == 2
    assert (
        f"{path}[0]: plugins[0].type: plugin type 'predicted-latency-producer' "
        "is not supported by epp: " in capsys.readouterr().out
    )


ALPHA_CONFIG = """\
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- name: pinned
  type: session-affinity-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: pinned}, {pluginRef: queue-scorer}]
"""


def test_an_alpha_plugin_is_refused_as_serve_refuses_it_without_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(ALPHA_CONFIG)
    valid, lines = run(path)
    assert not valid
    assert lines == [
        f"{path}[0]: plugin 'pinned' (type: 'session-affinity-scorer') has Alpha stability "
        "level, but command line flag --allow-experimental-plugins is not set",
        "1 documents checked, 1 errors",
    ]


@pytest.mark.parametrize(
    ("flags", "status"),
    [
        ([], 1),
        (["--allow-experimental-plugins"], 0),
        (["--allow-experimental-plugins=true"], 0),
        (["--allow-experimental-plugins=false"], 1),
    ],
)
def test_validate_takes_the_serve_flag_as_serve_spells_it(
    tmp_path: Path, capsys, flags: list[str], status: int
) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(ALPHA_CONFIG)
    assert main(["validate", *flags, str(path)]) == status


def test_an_invalid_yaml_file_in_a_folder_does_not_hide_the_other_files(tmp_path: Path) -> None:
    (tmp_path / "a-broken.yaml").write_text("a: [\n")
    (tmp_path / "b-bad.yaml").write_text(BAD)
    valid, lines = run(tmp_path)
    assert not valid
    assert lines[0].startswith(f"{tmp_path / 'a-broken.yaml'}: invalid YAML")
    assert sum(line.startswith(f"{tmp_path / 'b-bad.yaml'}[") for line in lines) == 3
    assert lines[-1] == "3 documents checked, 4 errors"


def test_an_objective_of_the_old_api_group_is_pointed_to_llm_d_ai(tmp_path: Path) -> None:
    path = tmp_path / "objective.yaml"
    path.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\n"
        "metadata: {name: old}\nspec: {priority: 1, poolRef: {name: pool}}\n"
    )
    valid, lines = run(path)
    assert not valid
    assert (
        "InferenceObjective is served as llm-d.ai/v1 and llm-d.ai/v1alpha2: change apiVersion"
        in lines[0]
    )
