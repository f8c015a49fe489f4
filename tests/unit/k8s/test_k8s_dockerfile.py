"""The Dockerfile's promises, read from the file (docker cannot run here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    start = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[start:]


def test_the_build_has_several_stages():
    assert sum(keyword == "FROM" for keyword, _ in instructions()) >= 2


def test_the_package_is_installed_from_pyproject():
    steps = instructions()
    assert ("COPY", "pyproject.toml README.md ./") in steps
    assert any(keyword == "RUN" and "pip install ." in rest for keyword, rest in steps)


def test_the_final_stage_copies_the_environment_and_installs_no_build_tools():
    stage = final_stage()
    assert ("COPY", "--from=build /opt/epp /opt/epp") in stage
    run = " ".join(rest for keyword, rest in stage if keyword == "RUN")
    for tool in ("apt-get install", "gcc", "build-essential", "pip install"):
        assert tool not in run


def test_the_image_runs_as_a_numeric_non_root_user():
    [user] = [rest for keyword, rest in final_stage() if keyword == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_entrypoint_is_epp_serve():
    [entrypoint] = [rest for keyword, rest in final_stage() if keyword == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["epp", "serve"]


def test_the_build_context_holds_only_the_package():
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignored
    assert {"!pyproject.toml", "!README.md", "!epp/"} <= set(ignored)
