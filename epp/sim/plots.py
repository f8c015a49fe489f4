"""PNG plots of a scenario run (matplotlib, Agg backend).

- `ttft_cdf.png`: per tier, the share of all its requests that completed
  with a TTFT up to t, one curve per policy; a curve tops out at the share
  completed, so a tier that shed most of its requests cannot look fast.
- `queue_depth.png`: per tier and policy, the requests waiting (in the EPP
  and in the servers' queues) by what became of them: served later, shed
  by the EPP (its TTL ran out, ...), or lost or left unserved.
- `service.png`: per policy, each tenant's service (weighted tokens).
- `limits.png`: per policy whose gate learned them, each server's limit.

Every time plot shares one time axis and marks the scenario's events and
the end of its arrivals; tiers and tenants carry the report's names
(`epp.sim.report.tier_label`, `tenant_label`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from epp.sim.engine import Simulation
from epp.sim.report import SHED_PREFIXES, event_label, tenant_label, tier_label
from epp.sim.requests import COMPLETED, SimRequest
from epp.sim.runner import ScenarioRun

PLOTS = ("ttft_cdf.png", "queue_depth.png", "service.png", "limits.png")
"""Every figure's file name (`limits.png` only when a gate learned limits)."""
POLICY_STYLES = ("-", "--", ":", "-.")
FATES = (
    ("served later", "tab:blue"),
    ("shed by the EPP (TTL, full queue, ...)", "tab:orange"),
    ("lost with a server or left unserved", "tab:gray"),
)


def ttft_cdf(requests: list[SimRequest]) -> tuple[np.ndarray, np.ndarray]:
    """TTFTs of the completed requests, sorted, and for each the share of
    *all* `requests` that completed with a TTFT up to it."""
    ttft = np.sort(
        [r.first_token_at - r.arrival for r in requests if r.outcome == COMPLETED], kind="stable"
    )
    return ttft, np.arange(1, len(ttft) + 1) / max(len(requests), 1)


def _fate(request: SimRequest) -> int:
    if request.outcome == COMPLETED:
        return 0
    if request.outcome is not None and request.outcome.startswith(SHED_PREFIXES):
        return 1
    return 2


def waiting_by_fate(
    requests: list[SimRequest], times: list[float] | np.ndarray
) -> list[np.ndarray]:
    """At each time, the requests that had arrived and not yet entered a
    batch (nor ended), split by `FATES`."""
    at = np.asarray(times)
    counts = []
    for fate in range(len(FATES)):
        chosen = [r for r in requests if _fate(r) == fate]
        arrived = np.sort([r.arrival for r in chosen])
        left = np.sort(
            [r.batched_at if r.batched_at is not None else r.finished_at or np.inf for r in chosen]
        )
        counts.append(
            np.searchsorted(arrived, at, side="right") - np.searchsorted(left, at, side="right")
        )
    return counts


def figures(run: ScenarioRun) -> dict[str, Figure]:
    """The figures by file name, not yet written."""
    scenario = run.scenario
    tiers = [o for o in scenario.objectives if any(t.objective == o.name for t in scenario.tenants)]
    members = {
        o.name: {i for i, t in enumerate(scenario.tenants) if t.objective == o.name} for o in tiers
    }
    end = max(max(sim.samples.times, default=0.0) for sim in run.runs.values())
    styles = {name: POLICY_STYLES[i % len(POLICY_STYLES)] for i, name in enumerate(run.runs)}
    colours = {name: f"C{i}" for i, name in enumerate(run.runs)}
    made: dict[str, Figure] = {}

    figure, rows = plt.subplots(
        len(tiers), 1, figsize=(8, 2.6 * len(tiers) + 0.6), sharex=True, squeeze=False
    )
    for axes, tier in zip(rows[:, 0], tiers, strict=True):
        for name, sim in run.runs.items():
            chosen = [r for r in sim.requests if r.tenant in members[tier.name]]
            x, y = ttft_cdf(chosen)
            done = len(x)
            label = (
                f"{name}: {done:,} of {len(chosen):,} completed ({done / max(len(chosen), 1):.1%})"
            )
            if done:
                axes.step(x, y, where="post", color=colours[name], ls=styles[name], label=label)
            else:
                axes.plot([], [], color=colours[name], ls=styles[name], label=label)
        axes.set_title(tier_label(tier.name, tier.priority), fontsize="medium")
        axes.set_ylim(0, 1.02)
        axes.set_ylabel("share of requests")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", loc="best")
    rows[-1, 0].set_xscale("log")
    rows[-1, 0].set_xlabel("TTFT (s); a curve ends at the share of the tier's requests completed")
    figure.suptitle(f"{scenario.name}: TTFT, over all of each tier's requests")
    made["ttft_cdf.png"] = figure

    names = list(run.runs)
    figure, grid = plt.subplots(
        len(tiers),
        len(names),
        figsize=(3.4 * len(names) + 1, 2.4 * len(tiers) + 1),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    for row, tier in enumerate(tiers):
        for column, name in enumerate(names):
            sim = run.runs[name]
            axes = grid[row, column]
            chosen = [r for r in sim.requests if r.tenant in members[tier.name]]
            counts = waiting_by_fate(chosen, sim.samples.times)
            axes.stackplot(
                sim.samples.times,
                counts,
                colors=[colour for _, colour in FATES],
                labels=[fate for fate, _ in FATES],
            )
            if row == 0:
                axes.set_title(name)
            if column == 0:
                axes.set_ylabel(f"{tier_label(tier.name, tier.priority)}\nrequests waiting")
            _mark(axes, run, end, label=row == 0 and column == 0)
    for axes in grid[-1]:
        axes.set_xlabel("time (s)")
    handles, labels = grid[0, 0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small")
    figure.suptitle(
        f"{scenario.name}: requests waiting (EPP and server queues), by what became of them"
    )
    made["queue_depth.png"] = figure

    figure, rows = plt.subplots(
        len(names), 1, figsize=(8, 2.6 * len(names) + 0.6), sharex=True, sharey=True, squeeze=False
    )
    for axes, name in zip(rows[:, 0], names, strict=True):
        sim = run.runs[name]
        for i, tenant in enumerate(scenario.tenants):
            axes.plot(
                sim.samples.times,
                [sample[i] / 1e6 for sample in sim.samples.service],
                label=tenant_label(tenant.name, tenant.objective),
            )
        axes.set_title(name, fontsize="medium")
        axes.set_ylabel("service (millions\nof weighted tokens)")
        axes.grid(alpha=0.3)
        _mark(axes, run, end, label=axes is rows[0, 0])
    rows[0, 0].legend(fontsize="small", loc="upper left")
    rows[-1, 0].set_xlabel("time (s)")
    figure.suptitle(f"{scenario.name}: service per tenant")
    made["service.png"] = figure

    learned = {name: sim for name, sim in run.runs.items() if any(sim.samples.limits)}
    if learned:
        figure, rows = plt.subplots(
            len(learned), 1, figsize=(8, 2.6 * len(learned) + 0.6), sharex=True, squeeze=False
        )
        for axes, (name, sim) in zip(rows[:, 0], learned.items(), strict=True):
            _limits(axes, sim)
            axes.set_title(name, fontsize="medium")
            _mark(axes, run, end, label=axes is rows[0, 0])
        rows[-1, 0].set_xlabel("time (s)")
        figure.suptitle(f"{scenario.name}: each server's learned in-flight limit")
        made["limits.png"] = figure
    return made


def _limits(axes: Axes, sim: Simulation) -> None:
    for address, server in zip(sim.addresses, sim.names, strict=True):
        axes.plot(
            sim.samples.times,
            [sample.get(address, np.nan) for sample in sim.samples.limits],
            label=server,
        )
    axes.set_ylabel("learned limit\n(requests)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="x-small", ncol=4, loc="lower right")


def _mark(axes: Axes, run: ScenarioRun, end: float, label: bool) -> None:
    """The scenario's events and the end of its arrivals, on one time axis."""
    axes.set_xlim(0, end)
    marks: dict[float, list[str]] = {}
    for event in run.scenario.events:
        marks.setdefault(event.at_s, []).append(event_label(event))
    marks.setdefault(run.scenario.duration_s, []).append("arrivals end")
    for at, texts in marks.items():
        text = ", ".join(texts)
        axes.axvline(at, color="black", lw=0.8, ls="--", alpha=0.6)
        if label:
            axes.annotate(
                text,
                (at, 1),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize="x-small",
            )


def write_plots(run: ScenarioRun, directory: Path) -> list[Path]:
    """Write the figures into `directory` (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, figure in figures(run).items():
        figure.tight_layout(rect=(0, 0.04, 1, 1) if name == "queue_depth.png" else None)
        path = directory / name
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
