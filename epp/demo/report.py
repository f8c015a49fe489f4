"""The numbers of a live run, in the shape of `epp simulate`'s report.

`{"scenario": {...}, "policies": {"epp": {...}}}`: per objective (tier) and
per tenant, the simulator's latency statistics (`epp.sim.report.latency_stats`,
which reads the client-side timings of each `LiveRequest`), and the outcomes
(`completed`, the EPP's drop reasons, `http-NNN`, `error: ...`). What only a
simulation can know (fairness service samples, prefix-cache hits, isolation
runs) is not there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from epp.demo.loadgen import LiveRequest
from epp.demo.loadwatch import render as render_load_view
from epp.sim.report import (
    COLUMNS,
    Slos,
    column_legend,
    latency_stats,
    render_table,
    scenario_summary,
    table_rows,
    tenant_slos,
)
from epp.sim.scenario import Scenario


def _stats(requests: list[LiveRequest], slos: Slos) -> dict[str, Any]:
    if not requests:
        return {"requests": 0, "completed": 0, "outcomes": {}}
    return latency_stats(requests, slos)  # type: ignore[arg-type]


def live_report(
    scenario: Scenario, requests: list[LiveRequest], wall_s: float, epp_config: str | None
) -> dict[str, Any]:
    tenants = scenario.tenants
    slos = tenant_slos(scenario)
    objectives: dict[str, Any] = {}
    for objective in scenario.objectives:
        members = {i for i, t in enumerate(tenants) if t.objective == objective.name}
        if not members:
            continue
        chosen = [r for r in requests if r.tenant in members]
        objectives[objective.name] = {
            "priority": objective.priority,
            **_stats(chosen, slos),
        }
    tenant_stats = {
        t.name: {
            "objective": t.objective,
            **_stats([r for r in requests if r.tenant == i], slos),
        }
        for i, t in enumerate(tenants)
    }
    policy = {
        "objectives": objectives,
        "tenants": tenant_stats,
        **_stats(requests, slos),
        "outcomes": dict(sorted(Counter(r.outcome for r in requests).items())),
        "statuses": {str(k): v for k, v in sorted(Counter(r.status for r in requests).items())},
    }
    return {
        "scenario": {
            **scenario_summary(scenario, len(requests), epp_config),
            "mode": "live",
            "wall_s": wall_s,
        },
        "policies": {"epp": policy},
    }


def render_live_text(report: dict[str, Any]) -> str:
    """Aligned text with the columns of `epp simulate` and their legend, and
    what the EPP saw of the servers' load."""
    info = report["scenario"]
    lines = [
        f"scenario {info['name']} (live, through Envoy, {info.get('engine', 'vllm')} servers): "
        f"seed {info['seed']}, "
        f"{info['duration_s']:g} s, {info['servers']} servers, {info['requests']} requests, "
        f"{info['wall_s']:.1f} s wall"
    ]
    for name, policy in report["policies"].items():
        lines.append("")
        lines.append(f"== {name}: outcomes {policy['outcomes']}")
        lines.extend(render_table(table_rows(policy), COLUMNS))
        for objective, s in policy["objectives"].items():
            others = {k: v for k, v in s["outcomes"].items() if k != "completed"}
            if others:
                lines.append(f"  {objective}: not completed {others}")
        stages = policy.get("stages")
        if stages is not None:
            lines.append(
                f"  stages: EPP decisions {stages['decisions']} "
                f"(disaggregated {stages['disaggregated_share']:.1%}); "
                f"remote prefills the servers ran: {stages['remote_prefills_run']}"
            )
    lines.append("")
    lines.append("columns:")
    lines.extend(column_legend(COLUMNS))
    if "load_view" in report:
        lines.append("")
        lines.extend(render_load_view(report["load_view"], info.get("engine", "vllm")))
    return "\n".join(lines)
