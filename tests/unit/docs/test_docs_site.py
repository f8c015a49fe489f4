"""The docs site (`mkdocs.yml`, `docs/`) and the README, its front page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epp.cli import docgen

ROOT = Path(__file__).parents[3]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",  # not -q: it hides the warnings --strict fails on
            "-f",
            str(config),
            "-d",
            str(site),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_docs_site_builds_with_strict_links(tmp_path: Path) -> None:
    built = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "configuration" / "plugins" / "index.html").exists()


@pytest.mark.parametrize(
    "page",
    ["[gone](missing.md)", "[gone](index.md#no-such-heading)"],
    ids=["page", "anchor"],
)
def test_a_broken_link_fails_the_docs_build(tmp_path: Path, page: str) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\n{page}\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\nnav:\n  - Home: index.md\n",
        encoding="utf-8",
    )
    built = build(config, tmp_path / "site")
    assert built.returncode != 0
    assert "index.md" in built.stderr


def test_the_readme_is_a_short_front_page() -> None:
    assert len(README.splitlines()) < 200


def test_the_readme_gives_the_two_setup_commands() -> None:
    assert "python3 -m pip install -e '.[demo]' && python3 -m epp demo" in README
    assert "python3 -m pip install -e '.[dev]' && python3 -m pytest" in README


def test_the_readme_links_only_to_pages_that_exist() -> None:
    import re

    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target


def test_the_flag_reference_is_the_parser() -> None:
    assert docgen.current("flags") is not None, "docs/configuration/flags.md lost its flags"
    assert docgen.current("flags") == docgen.flag_reference(), (
        "the flag reference is stale: run python3 -m epp.cli.docgen flags"
    )


def test_the_flag_reference_names_every_serve_flag() -> None:
    from epp.cli import build_parser

    _, commands = build_parser(every=True)
    reference = docgen.current("flags") or ""
    for action in commands["serve"]._actions:
        for option in action.option_strings:
            if option not in ("-h", "--help"):
                assert f"`{option}`" in reference, option


def test_the_simulator_page_shows_every_plot() -> None:
    from epp.sim.plots import PLOTS

    page = (ROOT / "docs" / "simulator.md").read_text(encoding="utf-8")
    for plot in PLOTS:
        shown = [line for line in page.splitlines() if line.startswith("![") and plot in line]
        assert shown, plot
        target = shown[0].split("](", 1)[1].rstrip(")")
        assert (ROOT / "docs" / target).is_file(), target
