from __future__ import annotations

from pathlib import Path

import pytest

from epp.api.manifests import ManifestError, load_manifests, load_objectives, load_pool
from epp.api.registry import ObjectiveRegistry


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


ROOT = Path(__file__).parents[3]
SAMPLES = ROOT / "config" / "samples"


def test_samples_build_a_registry_with_every_tier() -> None:
    registry = ObjectiveRegistry(load_pool(SAMPLES / "pool.yaml"))
    registry.replace(load_objectives([SAMPLES]))
    priorities = {o.name: o.priority for o in registry.objectives()}
    assert priorities == {"premium": 10, "standard": 0, "batch": -5, "interactive": 5}


def test_load_objectives_reports_every_invalid_document(tmp_path: Path) -> None:
    path = tmp_path / "objectives.yaml"
    path.write_text(
        "apiVersion: llm-d.ai/v1\nkind: InferenceObjective\nmetadata: {name: a}\nspec: {}\n"
        "---\n"
        "apiVersion: llm-d.ai/v1\nkind: InferenceObjective\nmetadata: {name: b}\n"
        "spec: {poolSelector: {}}\n"
    )
    with pytest.raises(ManifestError) as raised:
        load_objectives([path])
    assert str(raised.value).splitlines() == [
        f'{path}[0]: spec: Invalid value: "object": either poolRefs or poolSelector must be set',
        f'{path}[1]: spec.poolSelector: Invalid value: "object": poolSelector must not be empty',
    ]


def test_load_objectives_refuses_the_same_name_twice(tmp_path: Path) -> None:
    document = "apiVersion: llm-d.ai/v1\nkind: InferenceObjective\nmetadata: {name: a}\n"
    document += "spec: {poolRefs: [{name: p}]}\n"
    (tmp_path / "one.yaml").write_text(document)
    (tmp_path / "two.yaml").write_text(document)
    with pytest.raises(ManifestError, match=r"two.yaml\[0\]: metadata.name: Duplicate value: 'a'"):
        load_objectives([tmp_path])


def test_load_objectives_skips_pools_in_the_same_folder() -> None:
    assert all(o.name != "vllm-llama3-8b" for o in load_objectives([SAMPLES]))


def test_load_pool_needs_exactly_one_pool(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="expected exactly one InferencePool, found 0"):
        load_pool(SAMPLES / "objectives.yaml")
