"""`epp demo`: the whole system on loopback, as a new user first meets it.

Each test runs the command (or the stack it uses) and checks that every
process it started is gone afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys

import pytest

from epp.demo.processes import PartFailed
from epp.demo.stack import StackSettings, live_stack
from epp.sim.scenario import Objective
from epp.sim.server_model import ServerParams
from tests.support.waiting import gone

pytestmark = [pytest.mark.envoy]

DEMO = ("-m", "epp", "demo")


async def run_demo(out, *arguments: str) -> str:
    """`epp demo ARGUMENTS --json OUT` to its end: what it printed (it exited 0)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *DEMO,
        *arguments,
        "--json",
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    text = output.decode()
    assert process.returncode == 0, text
    return text


async def test_demo_prints_the_tier_table_and_writes_simulate_shaped_json(tmp_path):
    out = tmp_path / "demo.json"
    text = await run_demo(out, "--duration", "6")
    assert re.search(r"premium \(priority 10\)\s+\d+", text)
    epp_pid = int(re.search(r"epp serve: pid (\d+)", text).group(1))
    assert gone(epp_pid)
    tiers = json.loads(out.read_text())["policies"]["epp"]["objectives"]
    assert list(tiers) == ["premium", "standard", "batch"]
    assert tiers["premium"]["completed"] == tiers["premium"]["requests"] > 0
    assert tiers["premium"]["ttft_p50_s"] < tiers["batch"]["ttft_p50_s"]
    outcomes = json.loads(out.read_text())["policies"]["epp"]["outcomes"]
    assert not [outcome for outcome in outcomes if outcome.startswith("error")]


@pytest.mark.parametrize("engine", ["sglang", "trtllm-serve"])
async def test_demo_against_servers_posing_as_an_engine_reports_the_load_the_epp_saw(
    tmp_path, engine
):
    out = tmp_path / "demo.json"
    text = await run_demo(out, "--duration", "4", "--engine", engine)
    assert f"EPP's view of the {engine} servers" in text
    report = json.loads(out.read_text())
    view = report["load_view"]
    assert report["scenario"]["engine"] == engine
    assert view["saw_load"], view
    assert view["samples"] > 0
    assert view["view_age_p50_s"] <= view["scrape_interval_s"] + view["slack_s"], view
    assert not [o for o in report["policies"]["epp"]["outcomes"] if o.startswith("error")]


def as_at_a_terminal() -> None:
    """Ctrl-c's disposition as a terminal gives it: a shell that runs the suite
    in the background hands its children SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_ctrl_c_stops_everything_the_demo_started():
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *DEMO,
        "--duration",
        "30",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        preexec_fn=as_at_a_terminal,
    )
    try:
        seen = b""
        while b"playing" not in seen:
            line = await asyncio.wait_for(process.stdout.readline(), 30)
            assert line, seen.decode()
            seen += line
        epp_pid = int(re.search(rb"epp serve: pid (\d+)", seen).group(1))
        process.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(process.communicate(), 20)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
    assert process.returncode == 130, rest.decode()
    assert b"interrupted; everything started was stopped" in rest
    assert gone(epp_pid)


async def test_a_part_that_fails_to_start_is_named_and_the_rest_is_stopped(tmp_path):
    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("flowControl: {gate: {kinds: [teleport]}}\n")
    settings = StackSettings(
        servers=1,
        params=ServerParams(),
        objectives=(Objective("premium", 10),),
        epp_config=str(bad_config),
    )
    stack_seen = []
    with pytest.raises(PartFailed) as failure:
        async with live_stack(settings) as stack:
            stack_seen.append(stack)
    assert failure.value.part == "epp serve"
    assert "exited with status" in failure.value.reason
    assert not stack_seen
    assert "teleport" in str(failure.value)
