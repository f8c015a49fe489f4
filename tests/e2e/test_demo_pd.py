"""`epp demo config/scenarios/pd.yaml`: prefill/decode disaggregation live,
through a real Envoy, `epp serve` and the routing sidecars."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from tests.support.waiting import gone

pytestmark = [pytest.mark.envoy]


PD = Path(__file__).resolve().parents[2] / "config" / "scenarios" / "pd.yaml"


async def test_the_pd_demo_loses_nothing_and_its_servers_ran_every_prefill_the_epp_chose(
    tmp_path,
):
    out = tmp_path / "pd.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "epp", "demo", str(PD), "--duration", "8", "--json", str(out)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    text = output.decode()
    assert process.returncode == 0, text
    assert gone(int(re.search(r"epp serve: pid (\d+)", text).group(1)))
    epp = json.loads(out.read_text())["policies"]["epp"]
    assert epp["outcomes"] == {"completed": epp["requests"]}
    stages = epp["stages"]
    disaggregated = stages["decisions"]["prefill-decode"]
    assert disaggregated > 0 and stages["decisions"]["decode-only"] > 0
    assert sum(stages["decisions"].values()) == epp["requests"]
    assert stages["remote_prefills_run"] == disaggregated
