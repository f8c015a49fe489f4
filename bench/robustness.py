"""Flow control on random pools: `python3 -m bench.robustness [--seed S] [--pools N] [--quick]`.

Draws N overloaded pools from a seed (1 to 16 servers of one or two kinds,
`max_num_seqs` 8 to 256, prefill-bound and decode-bound, some KV-bound; 2
to 4 tiers at 1.3 to 2.5 times the pool's capacity, streamed and whole
responses, bursts, ramps, TTLs, servers that slow down, restart smaller,
restart or fail), runs each in the simulator with the shipped default
configuration (`config/epp/default.yaml`), with fixed per-endpoint limits
(B/4, B/2 and B for each kind's batch size B: `gate.kinds: [concurrency]`)
and with round-robin, and prints per pool and in total:

- `iso`: the top tier's p99 TTFT over its p99 alone (isolation), default
  config; `tuned`: the best isolation of the fixed limits that keep 0.95 of
  round-robin's tokens/s (of all of them when none does);
- `tok`: output tokens/s over round-robin's, both over the same window,
  the load's (`duration_s`): the tokens the pool produced while it was
  overloaded (a response still streaming at the end counts what it had
  produced). What finishes after the load is the drain of a backlog that
  the two policies hold in different places (round-robin in the servers,
  the EPP in its queue), and a request the EPP drops at its TTL neither
  shortens nor lengthens the window; whom the pool served first is the
  isolation criterion's question, not this one's. The fixed limits' 0.95 is
  judged the same way; `--json` also keeps `span_tokens_per_s` (every
  completed response's tokens from the first arrival to the last
  completion), the criterion before;
- `queue`: the longest server queue;
- `idle`: idle-capacity seconds while queued (summed over the servers:
  while the EPP holds queued requests, a live server with nothing waiting
  that could admit a request of the workload's mean size; sampled at each
  scrape) and `run`, the longest such stretch of one server;
- `settle`: when every learned limit stayed within 10% of its final value.

A pool passes when `iso` <= 2.0 or <= 1.1 x `tuned`, `tok` >= 0.95, and
`queue` <= 2 (issue 24's three criteria). Pool i of a seed is the same
whatever N, so `--pools 5` runs the first five of the 40. Virtual time:
the machine's load does not change a figure. `--dump DIR` writes each pool
as a scenario file for `epp simulate`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from epp.flowcontrol.config import GateKind
from epp.sim.report import latency_stats, limit_settling, tenant_slos
from epp.sim.requests import COMPLETED
from epp.sim.runner import simulate
from epp.sim.scenario import Scenario
from epp.sim.scenario_file import parse_scenario
from epp.sim.workload import workload

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "epp" / "default.yaml"
ISOLATION_TARGET = 2.0
TUNED_MARGIN = 1.1
TOKENS_TARGET = 0.95
QUEUE_TARGET = 2
REQUESTS_PER_POOL = 4000
"""About how many requests a pool's load draws (its duration follows)."""
QUICK_POOLS = 4


# -- the draw -------------------------------------------------------------------


def _kind(rng: random.Random, prompt: float, output: float) -> dict[str, Any]:
    """One server kind's parameters, and its capacity in requests/s for
    requests of mean `prompt` and `output` tokens."""
    batch = int(2 ** rng.uniform(3.0, 8.0))
    decode_ms = rng.uniform(6.0, 30.0)
    growth = rng.uniform(0.005, 0.03)
    prefill_ms = 10 ** rng.uniform(math.log10(0.03), math.log10(0.6))
    overhead_ms = rng.uniform(2.0, 10.0)
    block = 16
    blocks_per_request = (prompt + output) / block
    largest = 2.0 * (prompt + output) / block + 2
    if rng.random() < 0.2:  # KV-bound: the cache holds 30-80% of the batch
        kv_blocks = max(int(rng.uniform(0.3, 0.8) * batch * blocks_per_request), int(2 * largest))
    else:
        kv_blocks = max(8000, int(2 * batch * blocks_per_request))
    fits = min(batch, kv_blocks / blocks_per_request)
    step_ms = decode_ms * (1.0 + growth * (fits - 1.0))
    per_request_ms = overhead_ms + prefill_ms * prompt + output * step_ms / fits
    params = {
        "max_num_seqs": batch,
        "decode_ms_per_token": round(decode_ms, 2),
        "decode_batch_growth": round(growth, 4),
        "prefill_ms_per_token": round(prefill_ms, 4),
        "prefill_overhead_ms": round(overhead_ms, 2),
        "kv_blocks": kv_blocks,
        "block_size": block,
    }
    return {"params": params, "capacity_rps": 1000.0 / per_request_ms}


def _lengths(rng: random.Random, mean: float, spread: float) -> dict[str, list[int]]:
    """Uniform lengths around `mean` (bounded, so a KV-bound server always
    fits the largest request)."""
    low = max(1, int(mean * (1.0 - spread)))
    return {"uniform": [low, max(low, int(mean * (1.0 + spread)))]}


def draw_pool(seed: int, index: int, scale: float = 1.0) -> dict[str, Any]:
    """Pool `index` of `seed`, as a scenario document, with what was drawn
    under `shape` (capacity estimate, load, kinds); `scale` shortens the
    load (and its events) for a quick look."""
    rng = random.Random(f"robustness/{seed}/{index}")
    prefill_bound = rng.random() < 0.4
    prompt = rng.uniform(800, 3000) if prefill_bound else rng.uniform(50, 500)
    output = rng.uniform(20, 120) if prefill_bound else rng.uniform(50, 400)
    servers = rng.randint(1, 16)
    kinds = [_kind(rng, prompt, output)]
    if servers >= 2 and rng.random() < 0.4:
        kinds.append(_kind(rng, prompt, output))
    counts = (
        [servers] if len(kinds) == 1 else [(split := rng.randint(1, servers - 1)), servers - split]
    )
    capacity = sum(k["capacity_rps"] * n for k, n in zip(kinds, counts, strict=True))
    load = rng.uniform(1.3, 2.5)
    duration = scale * min(60.0, max(20.0, REQUESTS_PER_POOL / (load * capacity)))
    tiers = rng.randint(2, 4)
    top_share = rng.uniform(0.1, 0.35)
    rest = [rng.random() + 0.2 for _ in range(tiers - 1)]
    shares = [top_share] + [(load - top_share) * r / sum(rest) for r in rest]
    stream = rng.random() < 0.7
    objectives = []
    tenants = []
    for tier in range(tiers):
        name = f"tier{tier}"
        priority = 10 * (tiers - 1 - tier) if tier < tiers - 1 or rng.random() < 0.7 else -1
        objectives.append({"name": name, "priority": priority})
        members = rng.randint(1, 2)
        for member in range(members):
            rate = shares[tier] * capacity / members
            tenant: dict[str, Any] = {
                "name": f"{name}-{member}",
                "objective": name,
                "prompt_tokens": _lengths(rng, prompt, rng.uniform(0.2, 0.6)),
                "output_tokens": _lengths(rng, output, rng.uniform(0.2, 0.8)),
                "stream": stream if rng.random() < 0.8 else not stream,
            }
            shape = rng.random()
            if tier > 0 and shape < 0.15:
                on, off = rng.uniform(2.0, 8.0), rng.uniform(2.0, 8.0)
                tenant["arrival"] = {"bursts": {"on_s": round(on, 2), "off_s": round(off, 2)}}
                tenant["rate_rps"] = round(rate * (on + off) / on, 3)
            elif tier > 0 and shape < 0.3:
                tenant["arrival"] = {
                    "ramp": {"from_rps": round(0.4 * rate, 3), "to_rps": round(1.6 * rate, 3)}
                }
            else:
                tenant["arrival"] = "poisson"
                tenant["rate_rps"] = round(rate, 3)
            if tier > 0 and rng.random() < 0.2:
                tenant["ttl_s"] = round(rng.uniform(5.0, 30.0), 1)
            tenants.append(tenant)
    events = []
    if rng.random() < 0.25:
        server = rng.randrange(servers)
        params = kinds[0 if server < counts[0] else 1]["params"]
        factor = rng.uniform(2.0, 3.0)
        events.append(
            {
                "at_s": round(rng.uniform(0.3, 0.6) * duration, 2),
                "server_change": server,
                "params": {
                    "decode_ms_per_token": round(params["decode_ms_per_token"] * factor, 2),
                    "prefill_ms_per_token": round(params["prefill_ms_per_token"] * factor, 4),
                },
            }
        )
    if rng.random() < 0.1:
        server = rng.randrange(servers)
        params = kinds[0 if server < counts[0] else 1]["params"]
        events.append(
            {
                "at_s": round(rng.uniform(0.3, 0.6) * duration, 2),
                "server_change": server,
                "params": {"max_num_seqs": max(1, params["max_num_seqs"] // 2)},
            }
        )
    if servers >= 2 and rng.random() < 0.15:
        server = rng.randrange(servers)
        down = rng.uniform(0.2, 0.6) * duration
        events.append({"at_s": round(down, 2), "server_down": server})
        if rng.random() < 0.6:  # a restart, else a failure for good
            events.append({"at_s": round(down + rng.uniform(2.0, 8.0), 2), "server_up": server})
    groups = [{"servers": n, **kind["params"]} for kind, n in zip(kinds, counts, strict=True)]
    return {
        "name": f"robustness-{seed}-{index}",
        "seed": seed * 1000 + index,
        "duration_s": round(duration, 2),
        "pool": {"groups": groups},
        "objectives": objectives,
        "tenants": tenants,
        "events": events,
        "epp": {"config": str(DEFAULT_CONFIG)},
        "baselines": ["round-robin"],
        "drain_s": 120.0,
        "samples": 400,
        "shape": {
            "capacity_rps": round(capacity, 2),
            "load": round(load, 2),
            "prefill_bound": prefill_bound,
            "stream": stream,
            "kinds": [
                f"{n}x{k['params']['max_num_seqs']}"
                + ("kv" if k["params"]["kv_blocks"] < 8000 else "")
                for k, n in zip(kinds, counts, strict=True)
            ],
            "events": sorted(
                {next(key for key in e if key != "at_s" and key != "params") for e in events}
            ),
        },
    }


def scenario_of(document: dict[str, Any]) -> Scenario:
    return parse_scenario({k: v for k, v in document.items() if k != "shape"})


# -- the runs -------------------------------------------------------------------


def fixed_limits(scenario: Scenario) -> list[int]:
    """B/4, B/2 and B for each kind's batch size B."""
    values = set()
    for group in scenario.pool.groups:
        batch = group.params.max_num_seqs
        values.update((max(1, batch // 4), max(1, batch // 2), batch))
    return sorted(values)


def with_fixed_limit(scenario: Scenario, limit: int) -> Scenario:
    config = scenario.epp_config
    flow = config.flow_control
    gate = replace(flow.gate, kinds=frozenset({GateKind.CONCURRENCY}), max_per_endpoint=limit)
    return replace(scenario, epp_config=replace(config, flow_control=replace(flow, gate=gate)))


@dataclass(slots=True)
class Run:
    """One policy's figures on one pool (`tokens_per_s`: `tokens_in_window`;
    `span_tokens_per_s`: every completed response over its span)."""

    isolation: float | None
    tokens_per_s: float
    queue: int
    span_tokens_per_s: float = 0.0
    idle_s: float = 0.0
    idle_run_s: float = 0.0
    settled_s: float | None = None


def _top_tier(scenario: Scenario) -> str:
    return max(scenario.objectives, key=lambda o: o.priority).name


def tokens_in_window(scenario: Scenario, requests: list) -> float:
    """Output tokens/s the pool produced while the load lasted (its arrivals
    run from 0 to `duration_s`), over that window. A response still
    streaming at the end counts the tokens it had by then (taken as evenly
    spread from its first token to its end: only those two times are kept)."""
    end = scenario.duration_s
    tokens = 0.0
    for r in requests:
        if r.outcome != COMPLETED or r.first_token_at > end:
            continue
        if r.finished_at <= end:
            tokens += r.output_tokens
        else:
            rest = r.output_tokens - 1
            tokens += 1 + rest * (end - r.first_token_at) / (r.finished_at - r.first_token_at)
    return tokens / end


def run_policy(scenario: Scenario, arrivals: list, name: str, top: str | None) -> Run:
    """`name` ("epp" or "round-robin") over `arrivals`; with `top`, the
    top tier's isolation against its own run alone."""
    sim = simulate(scenario, arrivals, name, measure_idle=True)
    slos = tenant_slos(scenario)
    stats = latency_stats(sim.requests, slos)
    isolation = None
    if top is not None:
        members = {i for i, t in enumerate(scenario.tenants) if t.objective == top}
        mine = [r for r in sim.requests if r.tenant in members]
        alone_arrivals = [a for a in arrivals if a.tenant in members]
        alone = simulate(scenario, alone_arrivals, name)
        p99 = latency_stats(mine, slos)["ttft_p99_s"]
        reference = latency_stats(alone.requests, slos)["ttft_p99_s"]
        isolation = p99 / reference if p99 and reference else None
    idle = sim.idle.seconds if sim.idle is not None else [0.0]
    return Run(
        isolation=isolation,
        tokens_per_s=tokens_in_window(scenario, sim.requests),
        queue=max(s.max_waiting_seen for s in sim.servers),
        span_tokens_per_s=stats["tokens_per_s"],
        idle_s=sum(idle),
        idle_run_s=max(sim.idle.longest_s, default=0.0) if sim.idle is not None else 0.0,
        settled_s=limit_settling(sim).get("limit_settled_s"),
    )


@dataclass(slots=True)
class PoolResult:
    index: int
    shape: dict[str, Any]
    epp: Run
    round_robin: Run
    tuned: dict[int, Run] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        rr = self.round_robin.tokens_per_s
        return self.epp.tokens_per_s / rr if rr else 1.0

    @property
    def best_tuned(self) -> tuple[int, float] | None:
        """The fixed limit with the best isolation among those that keep
        `TOKENS_TARGET` of round-robin's tokens/s (all, when none does)."""
        rr = self.round_robin.tokens_per_s
        rated = [(run.isolation, limit, run) for limit, run in self.tuned.items() if run.isolation]
        good = [item for item in rated if rr == 0 or item[2].tokens_per_s >= TOKENS_TARGET * rr]
        best = min(good or rated, default=None, key=lambda item: item[0])
        return None if best is None else (best[1], best[0])

    @property
    def isolation_ok(self) -> bool:
        iso = self.epp.isolation
        if iso is None or iso <= ISOLATION_TARGET:
            return True
        best = self.best_tuned
        return best is not None and iso <= TUNED_MARGIN * best[1]

    @property
    def tokens_ok(self) -> bool:
        return self.tokens >= TOKENS_TARGET

    @property
    def queue_ok(self) -> bool:
        return self.epp.queue <= QUEUE_TARGET

    @property
    def passed(self) -> bool:
        return self.isolation_ok and self.tokens_ok and self.queue_ok


def run_pool(
    seed: int,
    index: int,
    tuned: bool = True,
    scale: float = 1.0,
    reuse: dict[str, Any] | None = None,
) -> PoolResult:
    """Pool `index` of `seed` under the default config and round-robin,
    and (`tuned`) each fixed limit; `reuse`, this pool's figures from an
    earlier run (`as_json`), gives round-robin's and the fixed limits'
    instead (they do not depend on the adaptive gate)."""
    document = draw_pool(seed, index, scale)
    scenario = scenario_of(document)
    arrivals = workload(scenario)
    top = _top_tier(scenario)
    epp = run_policy(scenario, arrivals, "epp", top)
    if reuse is not None and reuse["shape"] == document["shape"]:
        return PoolResult(
            index,
            document["shape"],
            epp,
            Run(**reuse["round_robin"]),
            {int(limit): Run(**run) for limit, run in reuse["tuned"].items()},
        )
    result = PoolResult(
        index, document["shape"], epp, run_policy(scenario, arrivals, "round-robin", None)
    )
    if tuned:
        for limit in fixed_limits(scenario):
            fixed = with_fixed_limit(scenario, limit)
            result.tuned[limit] = run_policy(fixed, arrivals, "epp", top)
    return result


# -- the report -----------------------------------------------------------------


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = (
    f"{'pool':>5} {'kinds':<16}{'shape':<22}{'load':>5}{'iso':>7}{'tuned':>12}{'tok':>6}"
    f"{'queue':>6}{'idle s':>8}{'run s':>7}{'settle':>7}  pass"
)


def pool_line(result: PoolResult) -> str:
    shape = result.shape
    kind = ("prefill" if shape["prefill_bound"] else "decode") + (
        " stream" if shape["stream"] else " whole"
    )
    events = ",".join(e.replace("server_", "") for e in shape["events"])
    best = result.best_tuned
    tuned = "-" if best is None else f"{best[1]:.2f}@{best[0]}"
    flags = "".join(
        mark if ok else "-"
        for mark, ok in (
            ("I", result.isolation_ok),
            ("T", result.tokens_ok),
            ("Q", result.queue_ok),
        )
    )
    return (
        f"{result.index:>5} {'+'.join(shape['kinds']):<16}{(kind + ' ' + events)[:21]:<22}"
        f"{shape['load']:>5.2f}{_f(result.epp.isolation):>7}{tuned:>12}{result.tokens:>6.2f}"
        f"{result.epp.queue:>6}{result.epp.idle_s:>8.1f}{result.epp.idle_run_s:>7.2f}"
        f"{_f(result.epp.settled_s, 1):>7}  {flags}{' ok' if result.passed else ''}"
    )


def totals(results: list[PoolResult]) -> dict[str, Any]:
    isolations = sorted(r.epp.isolation for r in results if r.epp.isolation is not None)
    settles = sorted(r.epp.settled_s for r in results if r.epp.settled_s is not None)

    def quantile(values: list[float], q: float) -> float | None:
        if not values:
            return None
        return values[min(len(values) - 1, int(q * len(values)))]

    return {
        "pools": len(results),
        "passed": sum(r.passed for r in results),
        "isolation_ok": sum(r.isolation_ok for r in results),
        "tokens_ok": sum(r.tokens_ok for r in results),
        "queue_ok": sum(r.queue_ok for r in results),
        "tokens_min": min((r.tokens for r in results), default=None),
        "isolation_median": statistics.median(isolations) if isolations else None,
        "isolation_p90": quantile(isolations, 0.9),
        "isolation_max": isolations[-1] if isolations else None,
        "queue_max": max((r.epp.queue for r in results), default=None),
        "idle_s": sum(r.epp.idle_s for r in results),
        "idle_run_max_s": max((r.epp.idle_run_s for r in results), default=None),
        "settle_median_s": statistics.median(settles) if settles else None,
        "settle_max_s": settles[-1] if settles else None,
    }


def total_line(summary: dict[str, Any]) -> str:
    return (
        f"total: {summary['passed']} of {summary['pools']} pass "
        f"(isolation {summary['isolation_ok']}, tokens {summary['tokens_ok']}, "
        f"queue {summary['queue_ok']}); tokens min {_f(summary['tokens_min'])}; "
        f"isolation median {_f(summary['isolation_median'])} p90 {_f(summary['isolation_p90'])} "
        f"max {_f(summary['isolation_max'])}; queue max {summary['queue_max']}; "
        f"idle {summary['idle_s']:.1f} s (longest {_f(summary['idle_run_max_s'])} s); "
        f"settle median {_f(summary['settle_median_s'], 1)} max {_f(summary['settle_max_s'], 1)} s"
    )


def as_json(result: PoolResult) -> dict[str, Any]:
    def run(r: Run) -> dict[str, Any]:
        return {
            "isolation": r.isolation,
            "tokens_per_s": r.tokens_per_s,
            "queue": r.queue,
            "span_tokens_per_s": r.span_tokens_per_s,
            "idle_s": r.idle_s,
            "idle_run_s": r.idle_run_s,
            "settled_s": r.settled_s,
        }

    return {
        "index": result.index,
        "shape": result.shape,
        "epp": run(result.epp),
        "round_robin": run(result.round_robin),
        "tuned": {str(limit): run(r) for limit, r in result.tuned.items()},
        "tokens": result.tokens,
        "best_tuned": result.best_tuned,
        "passed": result.passed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pools", type=int, default=40)
    parser.add_argument("--first", type=int, default=0, help="the first pool's index")
    parser.add_argument("--quick", action="store_true", help=f"the first {QUICK_POOLS} pools")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--dump", help="write each pool as a scenario file into this directory")
    parser.add_argument(
        "--reuse",
        help="a --json file of the same seed: take round-robin's and the fixed limits' "
        "figures from it (only the default config runs)",
    )
    parser.add_argument("--only", help="comma-separated pool indexes (instead of --first/--pools)")
    args = parser.parse_args(argv)
    count = QUICK_POOLS if args.quick else args.pools
    indexes = (
        [int(i) for i in args.only.split(",")]
        if args.only
        else list(range(args.first, args.first + count))
    )
    earlier: dict[int, Any] = {}
    if args.reuse:
        earlier = {p["index"]: p for p in json.loads(Path(args.reuse).read_text())["pools"]}
    if args.dump:
        folder = Path(args.dump)
        folder.mkdir(parents=True, exist_ok=True)
        for index in indexes:
            document = draw_pool(args.seed, index)
            document.pop("shape")
            (folder / f"{document['name']}.yaml").write_text(
                yaml.safe_dump(document, sort_keys=False)
            )
    print(f"seed {args.seed}, pools {','.join(map(str, indexes))}")
    print(HEADER)
    results = []
    for index in indexes:
        result = run_pool(args.seed, index, reuse=earlier.get(index))
        results.append(result)
        print(pool_line(result), flush=True)
    summary = totals(results)
    print(total_line(summary))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"seed": args.seed, "totals": summary, "pools": [as_json(r) for r in results]},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
