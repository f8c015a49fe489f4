"""The committed generated code is what protos/generate.py produces now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "epp" / "extproc" / "gen"


def _load_generator():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_protos(tmp_path):
    written = _load_generator().generate(tmp_path)
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in written}
    committed = {
        p.relative_to(GENERATED): p.read_bytes()
        for p in GENERATED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(committed)
    stale = [str(name) for name, content in fresh.items() if committed[name] != content]
    assert stale == [], "run: python protos/generate.py"


def test_runtime_uses_the_upb_backend():
    from google.protobuf.internal import api_implementation

    assert api_implementation.Type() == "upb"
