"""The live demo runs alike servers only."""

from pathlib import Path

from epp.cli import main

SCENARIOS = Path(__file__).resolve().parents[3] / "config" / "scenarios"


def test_the_demo_refuses_a_pool_of_several_server_groups(capsys):
    assert main(["demo", str(SCENARIOS / "adaptive-heterogeneous.yaml")]) == 2
    assert "several server groups runs only in the simulator" in capsys.readouterr().err
