"""The simulator's report and plots tell the truth: shed requests count in
the TTFT CDF, tiers have one name everywhere, events are marked on one time
axis, the table's columns never run together, and each policy's throughput
is explained."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import yaml

from epp.sim.plots import figures, ttft_cdf, waiting_by_fate
from epp.sim.report import (
    COLUMNS,
    ISOLATION,
    build_report,
    column_legend,
    render_table,
    render_text,
    throughput_note,
)
from epp.sim.requests import COMPLETED, SimRequest
from epp.sim.runner import run_scenario
from epp.sim.scenario_file import parse_scenario

ROOT = Path(__file__).resolve().parents[3]
# two servers, a premium tier and a sheddable batch tier whose TTL runs out
# while premium holds the servers, and a server down half-way
SCENARIO = """
name: shedding
seed: 3
duration_s: 20
pool: {servers: 2, max_num_seqs: 4, prefill_ms_per_token: 0.2, decode_ms_per_token: 12}
objectives: [{name: premium, priority: 10}, {name: batch, priority: -5}]
tenants:
  - {name: a, objective: premium, rate_rps: 6, prompt_tokens: 200, output_tokens: 100}
  - {name: b, objective: batch, rate_rps: 10, ttl_s: 2, prompt_tokens: 200, output_tokens: 100}
events: [{at_s: 8, server_down: 1}]
baselines: [round-robin]
"""


@pytest.fixture(scope="module")
def run():
    return run_scenario(parse_scenario(yaml.safe_load(SCENARIO), ROOT))


@pytest.fixture(scope="module")
def report(run):
    return build_report(run)


@pytest.fixture(scope="module")
def drawn(run):
    made = figures(run)
    yield made
    for figure in made.values():
        plt.close(figure)


def request(outcome: str, ttft: float = 0.1) -> SimRequest:
    r = SimRequest(request_id=0, prompt_tokens=1, output_tokens=1, tenant=0, arrival=0.0)
    r.outcome = outcome
    r.first_token_at = ttft if outcome == COMPLETED else None
    r.finished_at = ttft
    return r


def test_the_ttft_cdf_of_a_tier_that_shed_most_tops_out_at_its_completed_share():
    requests = [request(COMPLETED, 0.05)] + [request("rejected-ttl-expired")] * 99
    times, share = ttft_cdf(requests)
    assert list(times) == [0.05]
    assert share[-1] == pytest.approx(0.01)


def test_the_ttft_cdf_plot_says_how_many_of_each_tier_completed(drawn, report):
    legend = _texts(drawn["ttft_cdf.png"])
    batch = report["policies"]["epp"]["objectives"]["batch"]
    assert batch["completed"] < batch["requests"]
    assert f"epp: {batch['completed']:,} of {batch['requests']:,} completed" in " ".join(legend)


def test_the_ttft_cdf_has_one_panel_per_tier_and_a_curve_per_policy(drawn, run):
    axes = drawn["ttft_cdf.png"].axes
    assert len(axes) == len(run.scenario.objectives)
    for panel in axes:
        assert len(panel.get_legend().get_texts()) == len(run.runs)


def test_requests_shed_by_ttl_show_as_shed_not_as_a_queue_served(run):
    sim = run.runs["epp"]
    batch = [r for r in sim.requests if r.tenant == 1]
    expired = [r for r in batch if r.outcome == "rejected-ttl-expired"]
    assert expired
    served, shed, _ = waiting_by_fate(batch, sim.samples.times)
    for i, t in enumerate(sim.samples.times):
        assert shed[i] == sum(1 for r in expired if r.arrival <= t < r.finished_at)
        assert served[i] == sum(
            1 for r in batch if r.outcome == COMPLETED and r.arrival <= t < r.batched_at
        )
    assert shed.max() > 0


def test_every_plot_names_tiers_and_tenants_one_way(drawn):
    for name, figure in drawn.items():
        texts = " ".join(_texts(figure))
        assert "band" not in texts, name
        assert not re.search(r"\bobjective \w", texts), name
        for tier in ("premium", "batch"):
            for found in re.finditer(rf"\b{tier}\b", texts):
                after = texts[found.end() : found.end() + 14]
                before = texts[max(0, found.start() - 9) : found.start()]
                assert after.startswith((" (priority", ")")) or "tenant" in before, (name, texts)


def test_the_text_report_names_tiers_as_the_plots_do(report):
    text = render_text(report)
    assert "premium (priority 10)" in text and "batch (priority -5)" in text
    assert "objective premium" not in text and "band -5" not in text


def test_every_time_plot_marks_the_events_and_the_end_of_arrivals(drawn):
    for name in ("queue_depth.png", "service.png", "limits.png"):
        figure = drawn[name]
        texts = " ".join(_texts(figure))
        assert "server 1 down" in texts and "arrivals end" in texts, name
        for axes in figure.axes:
            marked = {line.get_xdata()[0] for line in axes.get_lines() if _vertical(line)}
            assert {8, 20} <= marked, name


def test_every_time_plot_shares_one_time_axis(drawn):
    ranges = {
        (name, axes.get_xlim())
        for name in ("queue_depth.png", "service.png", "limits.png")
        for axes in drawn[name].axes
    }
    assert len({xlim for _, xlim in ranges}) == 1, ranges


def test_table_columns_never_run_together_even_past_a_hundred(report):
    policy = report["policies"]["round-robin"]
    row = dict(policy["objectives"]["premium"], isolation_p99=374.03, goodput_rps=2.8)
    wide = dict(row, ttft_p99_s=163459.0, requests=123456, tokens_per_s=98765.4)
    columns = (*COLUMNS, ISOLATION)
    for stats in (row, wide):
        cells = render_table([("premium (priority 10)", stats)], columns)[-1].split()
        assert cells[-1] == "374.03"
        assert cells[-2] == "2.8"
        assert len(cells) == 3 + len(columns)  # the label is three words


def test_every_column_has_a_unit_row_and_a_legend_line(report):
    columns = (*COLUMNS, ISOLATION)
    legend = column_legend(columns)
    assert len(legend) == len(columns)
    for column, line in zip(columns, legend, strict=True):
        assert line.split()[0] == column.title
    assert any(line.split()[0] == "isol" and "alone" in line for line in legend)
    text = render_text(report)
    assert "ttft50" in text and "(s)" in text


def test_a_policy_that_shed_by_ttl_says_so_in_its_throughput_note(report):
    note = throughput_note(report, "epp")
    assert "rejected-ttl-expired" in note and "TTL" in note and "batch" in note
    assert "premium" in note  # the latency of the tier that is not sheddable


def test_a_baseline_note_gives_its_latency_for_the_tiers_that_matter(report):
    note = throughput_note(report, "round-robin")
    premium = report["policies"]["round-robin"]["objectives"]["premium"]
    assert note.startswith("round-robin: ")
    assert "TTFT p99 of the tiers that are not sheddable: premium" in note
    assert premium["ttft_p99_s"] is not None


def test_the_text_report_ends_with_a_note_per_policy(report):
    text = render_text(report)
    notes = text.split("throughput:\n", 1)[1].splitlines()
    assert [line.split(":")[0].strip() for line in notes] == list(report["policies"])


def _texts(figure) -> list[str]:
    found = [text.get_text() for text in figure.findobj(plt.Text)]
    return [t for t in found if t]


def _vertical(line) -> bool:
    x = line.get_xdata()
    return len(x) == 2 and x[0] == x[1]


def test_the_plots_are_the_ones_named(drawn):
    from epp.sim.plots import PLOTS

    assert set(drawn) == set(PLOTS)
