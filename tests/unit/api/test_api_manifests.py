from __future__ import annotations

from pathlib import Path

import pytest

from epp.manifests import ManifestError, load_manifests


def test_documents_keep_file_and_index(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("kind: A\n---\n---\nkind: B\n")
    manifests = load_manifests([path])
    assert [(m.source, m.index, m.object["kind"]) for m in manifests] == [
        (path, 0, "A"),
        (path, 2, "B"),
    ]
    assert manifests[1].where == f"{path}[2]"


def test_folder_yields_yaml_and_json_files_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yml").write_text("kind: B\n")
    (tmp_path / "a.yaml").write_text("kind: A\n")
    (tmp_path / "c.json").write_text('{"kind": "C"}')
    (tmp_path / "notes.txt").write_text("kind: ignored\n")
    assert [m.object["kind"] for m in load_manifests([tmp_path])] == ["A", "B", "C"]


def test_list_kind_is_flattened(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("kind: List\nitems: [{kind: A}, {kind: B}]\n")
    assert [m.object["kind"] for m in load_manifests([path])] == ["A", "B"]


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: [\n")
    with pytest.raises(ManifestError, match=f"{path}: invalid YAML"):
        load_manifests([path])


def test_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such file or directory"):
        load_manifests([tmp_path / "nothing.yaml"])
