"""Prometheus metrics with the reference EPP's names and labels, served on :9090.

Every metric is declared once in `catalogue` (name, kind, labels, help,
buckets, deprecated twin); the docs' metric table is generated from it
(`python3 -m epp.cli.docgen metrics`).

- `spec`: what a metric's declaration is (`Spec`, `Kind`, `Twin`);
- `catalogue`: the metric list, the table generator;
- `vocabulary`: the buckets, label sets and name prefixes the declarations share;
- `prefix_cache`: the precise prefix cache's family (KV-block index, KV events,
  prefix indexer, token producer), in the list's order;
- `series`: `Family` (one metric's series as plain numbers, and its twin),
  `Tally`, `BoundedLabel`;
- `recorder`: the per-request hooks (`RequestMetrics`), `TimedPlacer`,
  `PluginDurations`, the reference's outcome names;
- `shipping`: under --workers, a worker's stream-side series (`take`)
  added to the owner's page (`Merge`);
- `collectors`: what is read at scrape time (pool, saturation, limits,
  credits, scrape failures, transport, sessions, the precise prefix
  cache's index and events, the token producer);
- `page`: `EppMetrics` (the hooks and the collectors on one registry),
  `serve_metrics`.
"""

from epp.serve.metrics.collectors import StageView
from epp.serve.metrics.page import Authorize, EppMetrics, serve_metrics
from epp.serve.metrics.recorder import (
    PluginDurations,
    TimedPlacer,
    decision_type,
    flow_control_outcome,
)
from epp.serve.metrics.series import BoundedLabel, Tally
from epp.serve.metrics.vocabulary import SCHEDULER_BUCKETS

__all__ = [
    "SCHEDULER_BUCKETS",
    "Authorize",
    "BoundedLabel",
    "EppMetrics",
    "PluginDurations",
    "StageView",
    "Tally",
    "TimedPlacer",
    "decision_type",
    "flow_control_outcome",
    "serve_metrics",
]
