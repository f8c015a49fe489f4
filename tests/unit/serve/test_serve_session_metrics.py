"""The session-affinity bindings' gauge and the count its limit dropped."""

from __future__ import annotations

from epp.scheduling.sessions import SessionBindings
from epp.serve.metrics import EppMetrics


def samples(metrics: EppMetrics) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels["plugin"]): sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name.startswith("epp_session_bindings")
    }


def test_bindings_held_and_dropped_are_reported_per_plugin():
    bindings = SessionBindings(ttl=60, max_sessions=2, clock=lambda: 0.0)
    for session in ("a", "b", "c"):
        bindings.bind(session, "default/pod-rank-0")
    metrics = EppMetrics("pool")
    metrics.watch_sessions(lambda: {"sticky": bindings})
    assert samples(metrics) == {
        ("epp_session_bindings", "sticky"): 2,
        ("epp_session_bindings_dropped_total", "sticky"): 1,
    }
