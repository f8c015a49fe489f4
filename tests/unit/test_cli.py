"""`epp`'s front door: a command refuses what it is given as
`epp COMMAND: message` with exit status 2, a flag out of range in the parser."""

import pytest

from epp.cli import main


@pytest.mark.parametrize("command", ["simulate", "demo", "up"])
def test_a_scenario_with_errors_is_refused_before_anything_starts(command, tmp_path, capsys):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("duration_s: -1\n")
    assert main([command, str(scenario)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"epp {command}: {scenario}: ")
    assert "duration_s: must be > 0, got -1" in error


@pytest.mark.parametrize(
    "argv", [["demo", "--duration", "0"], ["demo", "--duration", "-1.5"], ["up", "--servers", "0"]]
)
def test_a_count_or_duration_flag_must_be_positive(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert f"argument {argv[1]}: must be positive, got '{argv[2]}'" in capsys.readouterr().err


def test_a_flag_that_is_no_number_is_named_by_its_type(capsys):
    with pytest.raises(SystemExit):
        main(["up", "--servers", "two"])
    assert "argument --servers: invalid int value: 'two'" in capsys.readouterr().err
