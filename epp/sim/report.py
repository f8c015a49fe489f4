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

Text (`render_text`): one table per policy, a row per tier (named
`tier_label`: the objective and its priority) and per tenant, the columns of
`COLUMNS` (each with its unit and a legend line, as wide as its widest
cell), and a sentence per policy on why its output tokens per second differ
from the best policy's (`throughput_note`: what it shed and why, lost, left
unserved, or held back in the EPP's queue).

Learned limits (the adaptive gate; absent for other gates and baselines):
each server's limit at the end of the load (`learned_limits`), and
`limit_settled_s`, the first sample time from which every server's limit
stays within 10% (at least one slot) of its final value until the end of
the load.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epp.sim.engine import Simulation
from epp.sim.requests import COMPLETED, UNFINISHED, SimRequest
from epp.sim.runner import ScenarioRun
from epp.sim.scenario import KvTransfer, Scenario, ServerEvent

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
    stats["span_s"] = span
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
    waiting = sim.samples.waiting
    service = sim.samples.service
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
        for when, limits in zip(sim.samples.times, sim.samples.limits, strict=True)
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
        "epp_queue_max": max((sum(q.values()) for q in sim.samples.queued), default=0),
        "unfinished_in_epp_queue": sum(
            1 for r in sim.requests if r.outcome == UNFINISHED and r.server < 0
        ),
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


def tier_label(name: str, priority: int) -> str:
    """The one name of a tier (an objective) in the text and every plot."""
    return f"{name} (priority {priority})"


def tenant_label(name: str, objective: str) -> str:
    return f"tenant {name} ({objective})"


def event_label(event: ServerEvent) -> str:
    what = "changed" if event.params is not None else ("up" if event.up else "down")
    return f"server {event.server} {what}"


SHED_PREFIXES = ("rejected-", "evicted")
"""Outcomes the EPP chose: the request ended without (further) service."""
LOST = ("server-failed", "server-rejected")
"""Outcomes a server caused."""


def outcome_counts(outcomes: dict[str, int]) -> dict[str, int]:
    """A row's outcomes in the table's four classes."""
    shed = sum(n for k, n in outcomes.items() if k.startswith(SHED_PREFIXES))
    lost = sum(n for k, n in outcomes.items() if k in LOST or k.startswith(("http-", "error")))
    return {
        "completed": outcomes.get(COMPLETED, 0),
        "shed": shed,
        "lost": lost,
        "unfinished": outcomes.get(UNFINISHED, 0),
    }


def _seconds(value: float | None, scale: float = 1.0) -> str:
    """Three significant figures at most, never an exponent."""
    if value is None:
        return "-"
    value *= scale
    for bound, digits in ((1, 3), (10, 2), (100, 1)):
        if abs(value) < bound:
            return f"{value:.{digits}f}"
    return f"{value:.0f}"


@dataclass(slots=True, frozen=True)
class Column:
    title: str
    unit: str
    meaning: str
    cell: Callable[[dict[str, Any]], str]


def _count(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda s: f"{outcome_counts(s.get('outcomes', {}))[key]:,}"


COLUMNS = (
    Column("reqs", "", "requests that arrived", lambda s: f"{s['requests']:,}"),
    Column("done", "", "completed", _count("completed")),
    Column(
        "shed",
        "",
        "ended by the EPP without service (TTL expired, queue full, no endpoint, evicted)",
        _count("shed"),
    ),
    Column("lost", "", "lost with their server (it failed or refused them)", _count("lost")),
    Column("left", "", "still waiting or running when the run stopped", _count("unfinished")),
    Column(
        "ttft50",
        "s",
        "time to first token, median of the completed",
        lambda s: _seconds(s["ttft_p50_s"]),
    ),
    Column(
        "ttft90", "s", "time to first token, 90th percentile", lambda s: _seconds(s["ttft_p90_s"])
    ),
    Column(
        "ttft99", "s", "time to first token, 99th percentile", lambda s: _seconds(s["ttft_p99_s"])
    ),
    Column(
        "tpot50",
        "ms",
        "time per output token after the first, median",
        lambda s: _seconds(s["tpot_p50_s"], 1000),
    ),
    Column(
        "tpot99",
        "ms",
        "time per output token, 99th percentile",
        lambda s: _seconds(s["tpot_p99_s"], 1000),
    ),
    Column("e2e50", "s", "arrival to last token, median", lambda s: _seconds(s["e2e_p50_s"])),
    Column(
        "e2e99", "s", "arrival to last token, 99th percentile", lambda s: _seconds(s["e2e_p99_s"])
    ),
    Column(
        "req/s",
        "1/s",
        "completed requests per second of the row's span (its first arrival to its last "
        "completion)",
        lambda s: f"{s['throughput_rps']:.1f}",
    ),
    Column(
        "tok/s",
        "1/s",
        "output tokens of the completed, per second of the same span",
        lambda s: f"{s['tokens_per_s']:,.0f}",
    ),
    Column(
        "good/s",
        "1/s",
        "completed requests per second of the same span that met both SLOs of their objective",
        lambda s: f"{s['goodput_rps']:.1f}",
    ),
)
"""The columns of the latency table, shared by `epp simulate` and `epp demo`;
latencies are over completed requests, rates over the row's span (first
arrival to last completion)."""

ISOLATION = Column(
    "isol",
    "x",
    "isolation: the tier's ttft99 / its ttft99 with its tenants running alone "
    "under the same policy (1 = the other tiers cost it nothing)",
    lambda s: "-" if s.get("isolation_p99") is None else f"{s['isolation_p99']:.2f}",
)


def render_table(rows: list[tuple[str, dict[str, Any]]], columns: Sequence[Column]) -> list[str]:
    """Rows under a two-line header (titles, units); every column as wide as
    its widest cell plus two spaces, so no two cells ever touch."""
    cells = [[column.cell(s) for column in columns] for _, s in rows]
    label_width = max([len(label) for label, _ in rows] + [4])
    widths = [
        max([len(column.title), len(column.unit)] + [len(row[i]) for row in cells]) + 2
        for i, column in enumerate(columns)
    ]
    lines = [
        "  "
        + "".ljust(label_width)
        + "".join(c.title.rjust(w) for c, w in zip(columns, widths, strict=True)),
        "  "
        + "".ljust(label_width)
        + "".join(c.unit.rjust(w) for c, w in zip(columns, widths, strict=True)),
    ]
    for (label, _), row in zip(rows, cells, strict=True):
        lines.append(
            "  "
            + label.ljust(label_width)
            + "".join(v.rjust(w) for v, w in zip(row, widths, strict=True))
        )
    return lines


def column_legend(columns: Sequence[Column]) -> list[str]:
    """One line per column: its title, unit and meaning."""
    width = max(len(c.title) for c in columns)
    return [
        f"  {c.title.ljust(width)}  {c.meaning}" + (f" ({c.unit})" if c.unit else "")
        for c in columns
    ]


def table_rows(policy: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A policy's rows: each tier, then each tenant, by their one name."""
    rows = [(tier_label(k, v["priority"]), v) for k, v in policy["objectives"].items()]
    rows += [(tenant_label(k, v["objective"]), v) for k, v in policy["tenants"].items()]
    return [(label, s) for label, s in rows if s["requests"]]


def throughput_note(report: dict[str, Any], name: str) -> str:
    """Why a policy's tokens per second are what they are: against the
    policy that delivered the most, what it shed, lost or left unserved, and
    its TTFT p99 for the tiers that are not sheddable."""
    policies = report["policies"]
    policy = policies[name]
    best = max(policies, key=lambda other: policies[other]["tokens_per_s"])
    tokens = policy["tokens_per_s"]
    parts = [f"{name}: {tokens:,.0f} output tokens/s"]
    if best != name and policies[best]["tokens_per_s"] > 0:
        ratio = tokens / policies[best]["tokens_per_s"]
        parts[0] += f", {ratio:.2f}x {best}'s {policies[best]['tokens_per_s']:,.0f}"
    reasons = []
    by_tier = policy["objectives"]
    shed: dict[str, dict[str, int]] = {}
    for tier, stats in by_tier.items():
        for outcome, count in stats["outcomes"].items():
            if outcome.startswith(SHED_PREFIXES):
                shed.setdefault(outcome, {})[tier] = count
    for outcome, tiers in sorted(shed.items()):
        listed = ", ".join(f"{count:,} {tier}" for tier, count in tiers.items())
        why = SHED_REASONS.get(outcome, "ended by the EPP without service")
        reasons.append(f"{sum(tiers.values()):,} {outcome} ({listed}): {why}")
    counts = outcome_counts(policy["outcomes"])
    if counts["unfinished"]:
        held = policy.get("unfinished_in_epp_queue", 0)
        where = f"; {held:,} of them held in the EPP's queue by the gate" if held else ""
        reasons.append(
            f"{counts['unfinished']:,} still waiting or running when the run stopped{where}"
        )
    if counts["lost"]:
        reasons.append(f"{counts['lost']:,} lost with a server")
    if policy.get("epp_queue_max"):
        reasons.append(
            f"held back by the gate: up to {policy['epp_queue_max']:,} waited in the EPP's "
            f"queue at once rather than in the servers'"
            + (
                f", so its last completion came {policy['span_s']:.0f} s after the first "
                f"arrival ({best}'s: {policies[best]['span_s']:.0f} s)"
                if best != name and policy["span_s"] > policies[best]["span_s"]
                else ""
            )
        )
    text = parts[0] + (": " + "; ".join(reasons) if reasons else "")
    kept = [(k, v) for k, v in by_tier.items() if v["priority"] >= 0 and v["requests"]]
    if kept:
        text += ". TTFT p99 of the tiers that are not sheddable: " + ", ".join(
            f"{k} {_seconds(v['ttft_p99_s'])} s" for k, v in kept
        )
    return text + "."


SHED_REASONS = {
    "rejected-ttl-expired": (
        "their TTL ran out while they waited behind higher tiers, by design: "
        "they are dropped rather than served late, leaving the servers to the tiers above"
    ),
    "rejected-saturated": "the queue was full",
    "rejected-no-endpoints": "no endpoint could take them",
    "evicted": "evicted from their server for a higher tier",
}
"""Why the EPP ends a request of each shed outcome, in a clause."""


def render_text(report: dict[str, Any]) -> str:
    """The report as aligned text tables, a legend line per column and a
    sentence per policy on its throughput."""
    lines = []
    info = report["scenario"]
    lines.append(
        f"scenario {info['name']}: seed {info['seed']}, {info['duration_s']:g} s, "
        f"{info['servers']} servers, {info['requests']} requests"
    )
    columns = (*COLUMNS, ISOLATION)
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
        lines.extend(render_table(table_rows(policy), columns))
        tiers = {k: v["priority"] for k, v in policy["objectives"].items()}
        for priority, band in policy["bands"].items():
            if len(band["tenants"]) < 2:
                continue
            named = ", ".join(tier_label(k, p) for k, p in tiers.items() if str(p) == priority)
            lines.append(
                f"  fairness in {named}: Jain {band['jain']:.4f} ({band['jain_basis']}), "
                f"service diff max {band['max_service_diff']:.0f} "
                f"avg {band['avg_service_diff']:.0f} (VTC bound {band['vtc_bound']:.0f})"
            )
    lines.append("")
    lines.append("columns:")
    lines.extend(column_legend(columns))
    lines.append("")
    lines.append("throughput:")
    lines.extend(f"  {throughput_note(report, name)}" for name in report["policies"])
    return "\n".join(lines)
