"""The Envoy + EPP path, per request, live: `python -m bench.gateway_path [SCENARIO] [--json]`.

Plays a scenario (default `config/scenarios/demo.yaml`) through the live
stack (simulated vLLM servers over HTTP, a real Envoy, `epp serve`) with
three clocks read per request, all `time.monotonic()` of one machine:

- the load generator: when it sent the request (`sent`), read its first
  token (`first read`) and its end (`end read`), each request named by its
  `x-request-id`;
- Envoy's access log (the default template with a file access log added):
  when the stream arrived (`DS_RX_BEG`, which is when Envoy opens the
  ext_proc stream to the EPP), when the request's body was in (`DS_RX_END`),
  when Envoy began sending it to the server the EPP picked (`US_TX_BEG`, so
  after the EPP's answer);
- the model server's timing log (`epp.demo.model_server --timing-log`):
  when its handler began (`received`), wrote the first token (`first
  written`) and ended the answer (`done`).

From them, in milliseconds (p50, p90, p99, per request):

- `request`: the client's send to the server's receipt, for the requests
  the EPP sent on without queueing them, which is the path the simulator's
  `pool.path_ms.request` models; `to_envoy` (the client to Envoy's stream),
  `epp` (the body in at Envoy to Envoy sending it on: the ext_proc round
  trip with the EPP's work) and `to_server` are its parts;
- `queued_epp`: the same `epp` part for the requests that waited in the
  EPP's queues (their wait included), for scale;
- `response`: the server's first token written to the client reading it
  (Envoy, the EPP's response-header and body round trips, Envoy); `end` is
  the same for the answer's end;
- `to_model` and `from_model`: the legs the simulator's `pool.path_ms`
  models, between the client and the server model itself (its request
  entering the model, the model's first token): `request` and `response`
  with the model server's handler and event loop around the model added
  (`handler`, both sides of it).

A request counts as not queued when the EPP answered its body within
`--straight-ms` (default 25 ms, below a decode step of the scenarios'
servers: a queued request waits at least until a running one finishes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from epp.demo.demo import client_timeout, stack_settings
from epp.demo.envoy_process import DEFAULT_TEMPLATE
from epp.demo.loadgen import COMPLETED, LiveRequest, LoadGenerator
from epp.demo.stack import live_stack
from epp.sim.scenario import Scenario
from epp.sim.scenario_file import load_scenario
from epp.sim.workload import Arrived, workload

DEFAULT_SCENARIO = Path(__file__).resolve().parents[1] / "config" / "scenarios" / "demo.yaml"
STRAIGHT_MS = 25.0
HCM_ANCHOR = "          stat_prefix: inference\n"
ACCESS_LOG = """          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format:
                json_format:
                  id: "%REQ(X-REQUEST-ID)%"
                  start: "%START_TIME(%s.%6f)%"
                  rx_end_us: "%COMMON_DURATION(DS_RX_BEG:DS_RX_END:us)%"
                  up_tx_us: "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%"
"""


def timed_template(directory: Path, log: Path, template: Path = DEFAULT_TEMPLATE) -> Path:
    """`template` with a JSON access log to `log`, written into `directory`."""
    text = template.read_text()
    if HCM_ANCHOR not in text:
        raise ValueError(f"{template}: no `stat_prefix: inference` to hang the access log on")
    timed = directory / "envoy-timed.yaml"
    timed.write_text(text.replace(HCM_ANCHOR, HCM_ANCHOR + ACCESS_LOG.format(path=log), 1))
    return timed


@dataclass(slots=True, frozen=True)
class Envoyed:
    """One request in Envoy's access log, in `time.monotonic()` seconds."""

    arrived: float
    body_in: float
    sent_up: float


@dataclass(slots=True, frozen=True)
class Served:
    """One request in a model server's timing log (`time.monotonic()` seconds)."""

    received: float
    first: float
    done: float
    model_first: float | None = None
    """The model's first token, seconds after the request entered it."""
    model_done: float | None = None
    entered: float | None = None
    """When the request entered the model."""

    def model_first_at(self) -> float | None:
        """When the model made the first token (None: not in the log)."""
        if self.entered is None or self.model_first is None:
            return None
        return self.entered + self.model_first


def read_envoy_log(path: Path, wall_minus_monotonic: float) -> dict[str, Envoyed]:
    """Envoy's access log by request id; Envoy stamps the wall clock, so
    `wall_minus_monotonic` (read once in this process) turns it monotonic."""
    found = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        start, up_tx = entry.get("start"), entry.get("up_tx_us")
        if not entry.get("id") or start in (None, "-") or up_tx in (None, "-"):
            continue  # never sent upstream (rejected by the EPP)
        arrived = float(start) - wall_minus_monotonic
        found[entry["id"]] = Envoyed(
            arrived, arrived + float(entry["rx_end_us"]) / 1e6, arrived + float(up_tx) / 1e6
        )
    return found


def read_server_log(path: Path) -> dict[str, Served]:
    found = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        found[entry["id"]] = Served(
            entry["received"],
            entry["first"],
            entry["done"],
            entry.get("model_first"),
            entry.get("model_done"),
            entry.get("entered"),
        )
    return found


def quantiles_ms(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    p50, p90, p99 = np.percentile(1000 * np.asarray(values), (50, 90, 99))
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "n": len(values)}


def path_of(
    requests: Sequence[LiveRequest],
    origin: float,
    envoy: Mapping[str, Envoyed],
    servers: Mapping[str, Served],
    streamed: Sequence[bool],
    straight_ms: float = STRAIGHT_MS,
) -> dict[str, Any]:
    """The path's parts over the completed requests seen by all three clocks
    (module docstring); `streamed[tenant]`: whether its first token is read
    apart from the answer's end."""
    names = ("request", "to_envoy", "epp", "to_server", "queued_epp", "response", "end")
    parts: dict[str, list[float]] = {k: [] for k in (*names, "to_model", "from_model", "handler")}
    for request in requests:
        seen, served = envoy.get(request.request_id), servers.get(request.request_id)
        if request.outcome != COMPLETED or seen is None or served is None:
            continue
        assert request.sent_at is not None and request.finished_at is not None
        epp = seen.sent_up - seen.body_in
        sent = origin + request.sent_at
        model_first = served.model_first_at()
        if epp * 1000 <= straight_ms:
            parts["request"].append(served.received - sent)
            parts["to_envoy"].append(seen.arrived - sent)
            parts["epp"].append(epp)
            parts["to_server"].append(served.received - seen.sent_up)
            if served.entered is not None:
                parts["to_model"].append(served.entered - sent)
        else:
            parts["queued_epp"].append(epp)
        if streamed[request.tenant] and request.first_token_at is not None:
            parts["response"].append(origin + request.first_token_at - served.first)
            if model_first is not None and served.entered is not None:
                parts["from_model"].append(origin + request.first_token_at - model_first)
                handler = served.entered - served.received + served.first - model_first
                parts["handler"].append(handler)
        parts["end"].append(origin + request.finished_at - served.done)
    return {name: quantiles_ms(values) for name, values in parts.items()}


async def play_timed(
    scenario: Scenario, arrivals: list[Arrived], directory: Path
) -> tuple[list[LiveRequest], float, Path, Path]:
    """The scenario live with the three clocks on: (requests, the load
    generator's origin, Envoy's access log, the servers' timing log)."""
    envoy_log, server_log = directory / "envoy-access.log", directory / "server-timing.log"
    settings = replace(
        stack_settings(scenario),
        envoy_template=timed_template(directory, envoy_log),
        server_timing_log=server_log,
    )
    async with live_stack(settings) as stack:
        assert stack.envoy is not None
        generator = LoadGenerator(
            stack.envoy.url, scenario, arrivals, timeout=client_timeout(scenario, arrivals)
        )
        gc.disable()  # a collection pause would make the load generator late by itself
        try:
            requests = await generator.run()
        finally:
            gc.enable()
    return requests, generator.origin, envoy_log, server_log


def measured_path(
    scenario: Scenario, requests: Sequence[LiveRequest], origin: float, logs: tuple[Path, Path]
) -> dict[str, Any]:
    wall_minus_monotonic = time.time() - time.monotonic()
    envoy = read_envoy_log(logs[0], wall_minus_monotonic)
    servers = read_server_log(logs[1])
    return path_of(requests, origin, envoy, servers, [t.stream for t in scenario.tenants])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_path", description=__doc__)
    parser.add_argument("scenario", nargs="?", default=str(DEFAULT_SCENARIO))
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (60)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    scenario = replace(
        load_scenario(args.scenario),
        duration_s=args.duration,
        events=(),
        baselines=(),
        variants=(),
        isolation=False,
    )
    arrivals = workload(scenario)
    with tempfile.TemporaryDirectory(prefix="epp-path-") as directory:
        requests, origin, *logs = asyncio.run(play_timed(scenario, arrivals, Path(directory)))
        result = measured_path(scenario, requests, origin, (logs[0], logs[1]))
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        for name, q in result.items():
            shown = "-" if q is None else f"{q['p50']:.1f} / {q['p90']:.1f} / {q['p99']:.1f}"
            print(f"{name:>11}  p50/p90/p99 ms  {shown}  (n={q['n'] if q else 0})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
