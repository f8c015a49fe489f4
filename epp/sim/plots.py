"""PNG plots of a scenario run (matplotlib, Agg backend): TTFT CDF per tier
and policy, queued requests per band over time, service per tenant over time,
and, when the EPP learned its limits, each server's limit over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from epp.sim.engine import COMPLETED
from epp.sim.runner import ScenarioRun


def write_plots(run: ScenarioRun, directory: Path) -> list[Path]:
    """Write the three figures into `directory` (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    scenario = run.scenario
    tenants = scenario.tenants
    written = []

    figure, axes = plt.subplots(figsize=(8, 5))
    for name, sim in run.runs.items():
        for objective in scenario.objectives:
            ttft = np.sort(
                [
                    r.first_token_at - r.arrival
                    for r in sim.requests
                    if r.outcome == COMPLETED and tenants[r.tenant].objective == objective.name
                ]
            )
            if len(ttft):
                axes.plot(
                    ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=f"{name} {objective.name}"
                )
    axes.set_xscale("log")
    axes.set_xlabel("TTFT (s)")
    axes.set_ylabel("fraction of completed requests")
    axes.legend(fontsize="small")
    written.append(_save(figure, directory / "ttft_cdf.png"))

    figure, axes = plt.subplots(figsize=(8, 5))
    for name, sim in run.runs.items():
        for priority in sorted({scenario.priority_of(t.objective) for t in tenants}, reverse=True):
            members = [
                i for i, t in enumerate(tenants) if scenario.priority_of(t.objective) == priority
            ]
            depth = [sum(sample[i] for i in members) for sample in sim.waiting_samples]
            axes.plot(sim.sample_times, depth, label=f"{name} band {priority}")
    axes.set_xlabel("time (s)")
    axes.set_ylabel("requests waiting (EPP and server queues)")
    axes.legend(fontsize="small")
    written.append(_save(figure, directory / "queue_depth.png"))

    names = list(run.runs)
    figure, all_axes = plt.subplots(len(names), 1, figsize=(8, 3 * len(names)), squeeze=False)
    for axes, name in zip(all_axes[:, 0], names, strict=True):
        sim = run.runs[name]
        for i, tenant in enumerate(tenants):
            axes.plot(
                sim.sample_times, [sample[i] for sample in sim.service_samples], label=tenant.name
            )
        axes.set_title(name)
        axes.set_ylabel("service (weighted tokens)")
        axes.legend(fontsize="small")
    all_axes[-1, 0].set_xlabel("time (s)")
    written.append(_save(figure, directory / "service.png"))

    learned = {name: sim for name, sim in run.runs.items() if any(sim.limit_samples)}
    if learned:
        figure, all_axes = plt.subplots(
            len(learned), 1, figsize=(8, 3 * len(learned)), squeeze=False
        )
        for axes, (name, sim) in zip(all_axes[:, 0], learned.items(), strict=True):
            for address, server in zip(sim.addresses, sim.names, strict=True):
                axes.plot(
                    sim.sample_times,
                    [sample.get(address, np.nan) for sample in sim.limit_samples],
                    label=server,
                )
            axes.set_title(name)
            axes.set_ylabel("learned in-flight limit")
            axes.legend(fontsize="small", ncol=2)
        all_axes[-1, 0].set_xlabel("time (s)")
        written.append(_save(figure, directory / "limits.png"))
    return written


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
