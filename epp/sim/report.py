"""The numbers of a scenario run, as one JSON-ready dict and as text.

Latencies: TTFT = first token - arrival; TPOT = (finish - first token) /
(output tokens - 1); end-to-end = finish - arrival; over completed requests.
Throughput counts completed requests and their output tokens over the span
from the first arrival to the last completion; goodput counts only those that
met both of their objective's SLOs (`slo_ttft_s`, and `slo_tpot_s` for a
request of more than one output token).

Disaggregation: `disaggregated_share` is the share of the requests sent to
a server that the policy sent by way of a prefill server (0 for the
baselines), `prefill_fallbacks` those of them prefilled on their decode
server after all (the prefill server refused or lost them), and
`kv_transfer_p50_s` the median time from a remote prefill's end to the
request's arrival at its decode server.

Fairness, per band, over token service (input weight x prompt tokens when a
request enters its server's batch, output weight x output tokens when it
completes; the weights of the band's configuration), sampled `samples`
times: a tenant is backlogged while it has requests that arrived and have not
entered a batch. Service differences are measured over runs of samples with
the same backlogged tenants (at least two), from the start of the run; the
max and the average are reported. Jain's index is over each tenant's service
during the intervals in which all of the band's tenants are backlogged (or
over the whole run when they never are, `jain_basis: total`). `vtc_bound` is
2 x the largest single-request charge in the band (the VTC paper's 2U with
one request in flight per tenant).

Isolation of a tier = its p99 TTFT / its p99 TTFT when its tenants run alone
under the same policy.

Learned limits (the adaptive gate; absent for other gates and baselines):
each server's limit at the end of the load (`learned_limits`), and
`limit_settled_s`, the first sample time from which every server's limit
stays within 10% (at least one slot) of its final value until the end of
the load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from epp.sim.engine import COMPLETED, SimRequest, Simulation
from epp.sim.runner import ScenarioRun
from epp.sim.scenario import KvTransfer, Scenario

QUANTILES = (50, 90, 99)


def _quantiles(values: list[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}_p{q}_s": None for q in QUANTILES}
    points = np.percentile(np.asarray(values), QUANTILES)
    return {f"{prefix}_p{q}_s": float(v) for q, v in zip(QUANTILES, points, strict=True)}


Slos = Sequence[tuple[float | None, float | None]]
"""Per tenant (by index): the (TTFT, TPOT) limits of its objective, None = no limit."""


def tenant_slos(scenario: Scenario) -> Slos:
    by_name = {o.name: (o.slo_ttft_s, o.slo_tpot_s) for o in scenario.objectives}
    return [by_name.get(t.objective, (None, None)) for t in scenario.tenants]


def _tpot(request: SimRequest) -> float:
    return (request.finished_at - request.first_token_at) / (request.output_tokens - 1)


def _meets(request: SimRequest, slos: Slos) -> bool:
    ttft_slo, tpot_slo = slos[request.tenant]
    if ttft_slo is not None and request.first_token_at - request.arrival > ttft_slo:
        return False
    return tpot_slo is None or request.output_tokens <= 1 or _tpot(request) <= tpot_slo


def latency_stats(requests: list[SimRequest], slos: Slos) -> dict[str, Any]:
    done = [r for r in requests if r.outcome == COMPLETED]
    ttft = [r.first_token_at - r.arrival for r in done]
    tpot = [_tpot(r) for r in done if r.output_tokens > 1]
    e2e = [r.finished_at - r.arrival for r in done]
    span = (max(r.finished_at for r in done) - min(r.arrival for r in requests)) if done else 0.0
    good = sum(1 for r in done if _meets(r, slos))
    tokens = sum(r.output_tokens for r in done)
    stats: dict[str, Any] = {"requests": len(requests), "completed": len(done)}
    stats.update(_quantiles(ttft, "ttft"))
    stats.update(_quantiles(tpot, "tpot"))
    stats.update(_quantiles(e2e, "e2e"))
    stats["throughput_rps"] = len(done) / span if span > 0 else 0.0
    stats["tokens_per_s"] = tokens / span if span > 0 else 0.0
    stats["goodput_rps"] = good / span if span > 0 else 0.0
    stats["outcomes"] = dict(sorted(Counter(r.outcome for r in requests).items()))
    return stats


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one gets all."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0


def band_fairness(sim: Simulation, members: list[int], bound: float) -> dict[str, Any]:
    waiting = sim.waiting_samples
    service = sim.service_samples
    diffs: list[float] = []
    start = 0
    current: tuple[int, ...] = ()
    full = [0.0] * len(members)
    full_intervals = 0
    for i in range(len(waiting)):
        backlogged = tuple(t for t in members if waiting[i][t] > 0)
        if i and backlogged == current and len(members) == len(backlogged):
            full_intervals += 1
            for k, t in enumerate(members):
                full[k] += service[i][t] - service[i - 1][t]
        if backlogged != current:
            current, start = backlogged, i
        if len(current) < 2:
            continue
        received = [service[i][t] - service[start][t] for t in current]
        diffs.append(max(received) - min(received))
    totals = [sim.service_by_tenant[t] for t in members]
    basis = "backlogged" if full_intervals else "total"
    return {
        "tenants": [sim.scenario.tenants[t].name for t in members],
        "jain": jain(full if full_intervals else totals),
        "jain_basis": basis,
        "max_service_diff": max(diffs, default=0.0),
        "avg_service_diff": float(np.mean(diffs)) if diffs else 0.0,
        "vtc_bound": bound,
        "service": {sim.scenario.tenants[t].name: s for t, s in zip(members, totals, strict=True)},
    }


def limit_settling(sim: Simulation) -> dict[str, Any]:
    """The learned limits at the end of the load and when they settled."""
    duration = sim.scenario.duration_s
    samples = [
        (when, limits)
        for when, limits in zip(sim.sample_times, sim.limit_samples, strict=True)
        if when <= duration and limits
    ]
    if not samples:
        return {}
    final = samples[-1][1]
    settled = samples[0][0]
    for when, limits in samples:
        for address, value in final.items():
            current = limits.get(address)
            if current is None or abs(current - value) > max(1.0, 0.1 * value):
                settled = when
                break
    names = dict(zip(sim.addresses, sim.names, strict=True))
    return {
        "learned_limits": {names[address]: value for address, value in sorted(final.items())},
        "limit_settled_s": settled,
    }


def policy_report(run: ScenarioRun, name: str) -> dict[str, Any]:
    sim = run.runs[name]
    scenario = run.scenario
    tenants = scenario.tenants
    by_tenant: dict[int, list[SimRequest]] = {i: [] for i in range(len(tenants))}
    for request in sim.requests:
        by_tenant[request.tenant].append(request)
    slos = tenant_slos(scenario)
    objectives: dict[str, Any] = {}
    for objective in scenario.objectives:
        members = [i for i, t in enumerate(tenants) if t.objective == objective.name]
        if not members:
            continue
        requests = [r for i in members for r in by_tenant[i]]
        stats = {"priority": objective.priority, **latency_stats(requests, slos)}
        alone = run.alone.get(name, {}).get(objective.name)
        if alone is not None:
            reference = latency_stats(alone.requests, slos)["ttft_p99_s"]
            stats["ttft_p99_alone_s"] = reference
            stats["isolation_p99"] = (
                stats["ttft_p99_s"] / reference if reference and stats["ttft_p99_s"] else None
            )
        objectives[objective.name] = stats
    tenant_stats = {
        t.name: {
            "objective": t.objective,
            "service": sim.service_by_tenant[i],
            **latency_stats(by_tenant[i], slos),
        }
        for i, t in enumerate(tenants)
    }
    bands: dict[str, Any] = {}
    for priority in sorted({scenario.priority_of(t.objective) for t in tenants}, reverse=True):
        members = [
            i
            for i, t in enumerate(tenants)
            if scenario.priority_of(t.objective) == priority and by_tenant[i]
        ]
        if not members:
            continue
        weights = sim._weights[members[0]]
        largest = max(
            weights[0] * r.prompt_tokens + weights[1] * r.output_tokens
            for i in members
            for r in by_tenant[i]
        )
        bands[str(priority)] = band_fairness(sim, members, 2 * largest)
    servers = sim.servers
    prompt = sum(s.prompt_tokens for s in servers)
    return {
        "objectives": objectives,
        "tenants": tenant_stats,
        "bands": bands,
        "outcomes": dict(sorted(Counter(r.outcome for r in sim.requests).items())),
        **latency_stats(sim.requests, slos),
        **disaggregation_stats(sim.requests, sim.scenario.kv_transfer),
        "prefix_cache_hit_rate": sum(s.cached_tokens for s in servers) / prompt if prompt else 0.0,
        "server_waiting_max": max(s.max_waiting_seen for s in servers),
        "server_waiting_limit": scenario.pool.params.max_waiting,
        "server_rejections": sum(s.rejected for s in servers),
        **limit_settling(sim),
    }


def disaggregation_stats(requests: list[SimRequest], transfer: KvTransfer) -> dict[str, Any]:
    sent = [r for r in requests if r.server >= 0]
    remote = [r for r in sent if r.prefill_server >= 0]
    moved = [transfer.seconds(r.prompt_tokens) for r in remote if r.prefilled_at is not None]
    return {
        "disaggregated_share": len(remote) / len(sent) if sent else 0.0,
        "prefill_fallbacks": sum(1 for r in remote if r.fallback),
        "kv_transfer_p50_s": float(np.median(moved)) if moved else None,
    }


def scenario_summary(scenario: Scenario, requests: int, epp_config: Any) -> dict[str, Any]:
    """The report's `scenario` section, shared by `epp simulate` and `epp demo`."""
    return {
        "name": scenario.name,
        "seed": scenario.seed,
        "duration_s": scenario.duration_s,
        "servers": scenario.pool.servers,
        "requests": requests,
        "epp_config": epp_config,
    }


def build_report(run: ScenarioRun) -> dict[str, Any]:
    scenario = run.scenario
    return {
        "scenario": scenario_summary(scenario, len(run.arrivals), scenario.epp_config_path),
        "policies": {name: policy_report(run, name) for name in run.runs},
    }


def _fmt(value: Any, scale: float = 1000.0) -> str:
    return "-" if value is None else f"{value * scale:.0f}"


LATENCY_HEADER = (
    f"  {'':<22}{'reqs':>7}{'done':>7}{'ttft p50':>9}{'p90':>7}{'p99':>8}"
    f"{'tpot p50':>9}{'p99':>6}{'e2e p50':>8}{'p99':>8}{'req/s':>7}{'tok/s':>8}"
    f"{'good/s':>7}"
)
"""The columns of `latency_row`, shared by `epp simulate` and `epp demo`."""


def latency_row(label: str, s: dict[str, Any]) -> str:
    """One objective's or tenant's latencies (ms), throughput and goodput."""
    return (
        f"  {label[:22]:<22}{s['requests']:>7}{s['completed']:>7}"
        f"{_fmt(s['ttft_p50_s']):>9}{_fmt(s['ttft_p90_s']):>7}{_fmt(s['ttft_p99_s']):>8}"
        f"{_fmt(s['tpot_p50_s']):>9}{_fmt(s['tpot_p99_s']):>6}"
        f"{_fmt(s['e2e_p50_s']):>8}{_fmt(s['e2e_p99_s']):>8}"
        f"{s['throughput_rps']:>7.1f}{s['tokens_per_s']:>8.0f}{s['goodput_rps']:>7.1f}"
    )


def render_text(report: dict[str, Any]) -> str:
    """The report as aligned text tables (latencies in milliseconds)."""
    lines = []
    info = report["scenario"]
    lines.append(
        f"scenario {info['name']}: seed {info['seed']}, {info['duration_s']:g} s, "
        f"{info['servers']} servers, {info['requests']} requests"
    )
    header = LATENCY_HEADER + f"{'isol':>6}"
    for name, policy in report["policies"].items():
        lines.append("")
        lines.append(
            f"== {name}: outcomes {policy['outcomes']}, prefix-cache hits "
            f"{policy['prefix_cache_hit_rate']:.1%}, server queue max "
            f"{policy['server_waiting_max']} (limit {policy['server_waiting_limit'] or 'none'}), "
            f"server rejections {policy['server_rejections']}, disaggregated "
            f"{policy['disaggregated_share']:.1%} ({policy['prefill_fallbacks']} fell back)"
        )
        if "learned_limits" in policy:
            limits = " ".join(str(v) for v in policy["learned_limits"].values())
            lines.append(f"  learned limits {limits}, settled at {policy['limit_settled_s']:.1f} s")
        lines.append(header)
        rows = [(f"objective {k}", v) for k, v in policy["objectives"].items()]
        rows += [(f"tenant {k}", v) for k, v in policy["tenants"].items()]
        for label, s in rows:
            isolation = s.get("isolation_p99")
            lines.append(
                latency_row(label, s) + f"{'-' if isolation is None else f'{isolation:.2f}':>6}"
            )
        for priority, band in policy["bands"].items():
            if len(band["tenants"]) < 2:
                continue
            lines.append(
                f"  band {priority}: Jain {band['jain']:.4f} ({band['jain_basis']}), "
                f"service diff max {band['max_service_diff']:.0f} "
                f"avg {band['avg_service_diff']:.0f} (VTC bound {band['vtc_bound']:.0f})"
            )
    return "\n".join(lines)
