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
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
flowControl: {defaultRequestTTL: soon}
"""


def run(*paths: Path | str) -> tuple[bool, list[str]]:
    out = io.StringIO()
    status = validate([str(path) for path in paths], out)
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
        "config/epp/header-profile.yaml",
        "config/epp/session-affinity.yaml",
    ],
)
def test_shipped_file_is_valid(path: str) -> None:
    valid, lines = run(ROOT / path)
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
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: predicted-latency-producer\n"
    )
    assert main(["validate", str(path)]) == 2
    assert (
        f"{path}[0]: plugins[0].type: plugin type 'predicted-latency-producer' "
        "is not supported by epp: " in capsys.readouterr().out
    )
