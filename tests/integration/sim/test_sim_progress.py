"""`epp simulate`'s progress bars: drawn on a terminal, never into a file or a pipe."""

from __future__ import annotations

import io
from pathlib import Path

from epp.cli import main
from epp.sim import command
from epp.sim.command import ProgressBars

SCENARIOS = Path(__file__).resolve().parents[3] / "config" / "scenarios"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def short_scenario(tmp_path: Path) -> Path:
    scenario = tmp_path / "unloaded.yaml"
    text = (SCENARIOS / "unloaded.yaml").read_text().replace("duration_s: 120", "duration_s: 5")
    scenario.write_text(
        text.replace("../epp/default.yaml", str(SCENARIOS.parent / "epp" / "default.yaml"))
    )
    return scenario


def test_simulate_into_a_file_writes_no_progress_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "PROGRESS_AFTER_S", 0.0)  # a bar as soon as one may be drawn
    assert main(["simulate", str(short_scenario(tmp_path))]) == 0
    captured = capsys.readouterr()
    assert "== epp" in captured.out
    assert "\r" not in captured.out + captured.err


def test_progress_bars_are_drawn_on_a_terminal(monkeypatch):
    monkeypatch.setattr(command, "PROGRESS_AFTER_S", 0.0)
    terminal = Terminal()
    update = ProgressBars(10.0, terminal)("epp")
    update(5.0)
    update(10.0)
    assert "\r" in terminal.getvalue() and "epp" in terminal.getvalue()
