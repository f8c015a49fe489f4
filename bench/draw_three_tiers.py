"""Three-tier overloads drawn at random for `bench.sim_vs_live`:
`python -m bench.draw_three_tiers [--seed N] [--count K] [--out DIR]`.

Draws pools and workloads from `random.Random(seed)` (servers' batch size
and step times, prompt and output lengths, each tier's share of the load,
which tiers stream, batch's TTL, 1.2-1.6 times a rough estimate of the
pool's capacity) under `config/epp/default.yaml`, and keeps the first
`count` draws that the comparison can judge, by the simulator's run of them
(virtual time, before anything is played live):

- an overload: the lowest tier waits (its TTFT p50 at least
  `QUEUED_P50_S`), so the pool's room is what the tiers contend for;
- every tier completes at least `MIN_COMPLETED` requests in `DURATION_S`,
  so each tier's p90 rests on a few dozen requests, not a handful (an
  overload whose top tiers alone fill the pool starves batch, and its TTFT
  quantiles are then the luck of the few that slipped into a gap);
- small enough to play live on two cores beside Envoy and the EPP
  (`MAX_RATE_RPS`).

Each kept draw is written as `three-tiers-drawn-<seed>-<n>.yaml` with the
draw's parameters in its header; a rejected draw is printed with why.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from epp.sim.requests import COMPLETED
from epp.sim.runner import simulate
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "scenarios"
DEFAULT_CONFIG = ROOT / "config" / "epp" / "default.yaml"
DURATION_S = 180.0
MIN_COMPLETED = 300
QUEUED_P50_S = 1.0
MAX_RATE_RPS = 16.0
MAX_DRAWS = 200
DECODE_BATCH_GROWTH = 0.02
TIERS = (("premium", 10, 1.0), ("standard", 0, 5.0), ("batch", -5, None))
TENANTS = ("assistant", "summarize", "backfill")


@dataclass(slots=True, frozen=True)
class Draw:
    servers: int
    max_num_seqs: int
    decode_ms: int
    prefill_ms_per_token: float
    prompt: tuple[int, int]
    output: tuple[int, int]
    load: float
    shares: tuple[float, float, float]
    streams: tuple[bool, bool, bool]
    batch_ttl_s: int | None

    def capacity_rps(self) -> float:
        """Requests a second the pool completes with full batches (rough:
        mean output tokens at the full batch's step, plus the mean prefill)."""
        step_s = self.decode_ms / 1000 * (1 + DECODE_BATCH_GROWTH * self.max_num_seqs)
        prefill_s = (5 + self.prefill_ms_per_token * sum(self.prompt) / 2) / 1000
        service_s = sum(self.output) / 2 * step_s + prefill_s
        return self.servers * self.max_num_seqs / service_s

    def rates(self) -> tuple[float, ...]:
        total = self.load * self.capacity_rps()
        return tuple(round(total * share, 1) for share in self.shares)


def draw(rng: random.Random) -> Draw:
    shares = (rng.uniform(0.2, 0.35), rng.uniform(0.3, 0.45))
    prompt_low = rng.randrange(100, 301, 50)
    output_low = rng.randrange(30, 76, 5)
    return Draw(
        servers=3,
        max_num_seqs=rng.choice((8, 12, 16)),
        decode_ms=rng.randrange(15, 31),
        prefill_ms_per_token=rng.choice((0.1, 0.15)),
        prompt=(prompt_low, rng.randrange(max(600, prompt_low + 200), 1201, 100)),
        output=(output_low, rng.randrange(120, 226, 15)),
        load=round(rng.uniform(1.2, 1.6), 2),
        shares=(*shares, 1 - sum(shares)),
        streams=(True, rng.random() < 0.5, rng.random() < 0.5),
        batch_ttl_s=rng.choice((None, 30, 60)),
    )


def document(name: str, seed: int, drawn: Draw, out: Path) -> dict[str, Any]:
    tenants = []
    for tenant, (objective, _, _), rate, stream in zip(
        TENANTS, TIERS, drawn.rates(), drawn.streams, strict=True
    ):
        entry: dict[str, Any] = {
            "name": tenant,
            "objective": objective,
            "rate_rps": rate,
            "arrival": "poisson",
            "stream": stream,
            "prompt_tokens": {"uniform": list(drawn.prompt)},
            "output_tokens": {"uniform": list(drawn.output)},
        }
        if objective == "batch" and drawn.batch_ttl_s is not None:
            entry["ttl_s"] = drawn.batch_ttl_s
        tenants.append(entry)
    objectives = [
        {"name": tier, "priority": priority, **({"slo_ttft_s": slo} if slo else {})}
        for tier, priority, slo in TIERS
    ]
    return {
        "name": name,
        "seed": seed,
        "duration_s": DURATION_S,
        "model": "demo-model",
        "pool": {
            "servers": drawn.servers,
            "max_num_seqs": drawn.max_num_seqs,
            "prefill_ms_per_token": drawn.prefill_ms_per_token,
            "prefill_overhead_ms": 5,
            "decode_ms_per_token": drawn.decode_ms,
            "decode_batch_growth": DECODE_BATCH_GROWTH,
            "kv_blocks": 4000,
            "block_size": 16,
        },
        "objectives": objectives,
        "tenants": tenants,
        "epp": {"config": os.path.relpath(DEFAULT_CONFIG, out)},
        "baselines": [],
    }


def judged(doc: dict[str, Any], base: Path) -> tuple[list[str], dict[str, Any]]:
    """Why the simulator's run of `doc` cannot be judged (empty: it can),
    and per tier what it completed and its TTFT p50."""
    scenario = parse_scenario(doc, base)
    arrivals = workload(scenario)
    requests = simulate(scenario, arrivals, "epp").requests
    streams = [t.stream for t in scenario.tenants]
    tiers: dict[str, Any] = {}
    problems = []
    if sum(t["rate_rps"] for t in doc["tenants"]) > MAX_RATE_RPS:
        problems.append(f"offers more than {MAX_RATE_RPS:g} requests a second")
    for index, (tier, _, _) in enumerate(TIERS):
        done = [r for r in requests if r.tenant == index and r.outcome == COMPLETED]
        first = [(r.first_token_at if streams[index] else r.finished_at) - r.arrival for r in done]
        p50 = float(np.percentile(first, 50)) if first else None
        tiers[tier] = {"completed": len(done), "ttft_p50_s": p50}
        if len(done) < MIN_COMPLETED:
            problems.append(f"{tier} completes {len(done)} (< {MIN_COMPLETED})")
    lowest = tiers[TIERS[-1][0]]["ttft_p50_s"]
    if lowest is None or lowest < QUEUED_P50_S:
        problems.append(f"no overload: batch's TTFT p50 {lowest} s (< {QUEUED_P50_S:g} s)")
    return problems, tiers


def header(seed: int, number: int, drawn: Draw, tiers: dict[str, Any]) -> str:
    done = ", ".join(
        f"{tier} {t['completed']} done, TTFT p50 {t['ttft_p50_s']:.2f} s"
        for tier, t in tiers.items()
    )
    return (
        f"# A three-tier overload drawn at random for bench.sim_vs_live\n"
        f"# (`python3 -m bench.draw_three_tiers --seed {seed}`, kept draw {number}):\n"
        f"# {drawn.servers} servers of {drawn.max_num_seqs} sequences, {drawn.decode_ms} ms a "
        f"decode step, {drawn.load}x a rough capacity\n"
        f"# of {drawn.capacity_rps():.1f} requests a second, under the default configuration.\n"
        f"# Simulated when drawn: {done}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=125)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    kept = 0
    for attempt in range(1, MAX_DRAWS + 1):
        drawn = draw(rng)
        name = f"three-tiers-drawn-{args.seed}-{kept + 1}"
        doc = document(name, args.seed * 100 + attempt, drawn, args.out)
        problems, tiers = judged(doc, args.out)
        if problems:
            print(f"draw {attempt}: left out: {'; '.join(problems)}")
            continue
        kept += 1
        path = args.out / f"{name}.yaml"
        path.write_text(
            header(args.seed, kept, drawn, tiers) + yaml.safe_dump(doc, sort_keys=False)
        )
        print(f"draw {attempt}: kept as {path}")
        if kept == args.count:
            return 0
    print(f"only {kept} of {args.count} draws kept in {MAX_DRAWS}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
