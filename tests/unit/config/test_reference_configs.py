"""Every sample configuration of the reference EPP (copied into
tests/data/reference_configs, source in its README) either loads, or is
refused naming each plugin type epp cannot run, and nothing else. Alpha
plugins load with --allow-experimental-plugins, as in the reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp.cli import main

SAMPLES = Path(__file__).parents[2] / "data" / "reference_configs"
COMPATIBILITY = Path(__file__).parents[3] / "docs" / "compatibility.md"
LOADING = {
    "dp-epp-config.yaml",
    "epp-config.yaml",
    "epp-estimate-prefix-cache-config.yaml",
    "epp-precise-prefix-cache-config.yaml",
    "pd-epp-config.yaml",
    "pd-hybrid-saturation-epp-config.yaml",
    "probabilistic-admitter-epp-config.yaml",
    "sim-e-p-d-epp-config.yaml",
    "sim-e-pd-epp-config.yaml",
    "sim-epp-config.yaml",
    "sim-epp-kvcache-config.yaml",
    "sim-epp-no-hit-lru.yaml",
    "sim-epp-tokenizer-vllm-http-config.yaml",
    "sim-pd-epp-config.yaml",
    "sim-program-aware-config.yaml",
    "soft-reflective-ceiling-epp-config.yaml",
}


def test_the_fixtures_are_all_there() -> None:
    assert len(list(SAMPLES.glob("*.yaml"))) == 23


def test_the_compatibility_page_counts_the_samples_that_load() -> None:
    text = " ".join(COMPATIBILITY.read_text().split())
    counts = re.findall(r"(\d+) of (\d+) load", text)
    assert counts == [(str(len(LOADING)), str(len(list(SAMPLES.glob("*.yaml")))))]


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.yaml")), ids=lambda path: path.name)
def test_a_reference_sample_loads_or_is_refused_by_plugin(path: Path, capsys) -> None:
    status = main(["validate", "--allow-experimental-plugins", str(path)])
    lines = capsys.readouterr().out.splitlines()
    errors = [line for line in lines[:-1] if ": warning: " not in line]
    if path.name in LOADING:
        assert status == 0, lines
        return
    assert status == 2, lines
    assert errors
    for line in errors:
        assert ".type: plugin type '" in line and "' is not supported by epp: " in line, line
