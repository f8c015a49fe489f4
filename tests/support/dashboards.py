"""The reference's dashboards and alert rules (`tests/data/reference_dashboards/`)
as queries, and what a `/metrics` page lacks for each.

A query's EPP selectors are those naming an EPP series (the reference's
prefixes); model-server (`vllm:*`), body-based-router (`bbr_*`) and
Prometheus' own (`up`) series are not the EPP's to emit. Labels Prometheus
adds when it scrapes (`namespace`, `pod`, ...) are not the EPP's either.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.promql import Selector, reads

DATA = Path(__file__).parents[1] / "data" / "reference_dashboards"
EPP_PREFIXES = (
    "llm_d_epp_",
    "inference_objective_",
    "inference_pool_",
    "inference_extension_",
    "llm_d_inference_scheduler_",
)
TARGET_LABELS = frozenset({"namespace", "pod", "job", "instance", "service", "container"})
"""Labels Prometheus attaches to every series it scrapes from a pod."""


@dataclass(slots=True, frozen=True)
class Query:
    source: str
    """The data file."""
    panel: str
    """The panel's title, or the alert's name."""
    expr: str

    def epp_selectors(self) -> list[Selector]:
        return [s for s in reads(self.expr) if s.name.startswith(EPP_PREFIXES)]


def _grafana_panels(panels: list[dict]) -> Iterator[dict]:
    for panel in panels:
        yield panel
        yield from _grafana_panels(panel.get("panels", []))


def reference_queries() -> list[Query]:
    """Every target of every panel and every alert rule, in file order."""
    queries = []
    for path in sorted(DATA.glob("*.json")):
        for panel in _grafana_panels(json.loads(path.read_text())["panels"]):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append(Query(path.name, panel["title"], target["expr"]))
    for path in sorted(DATA.glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        for group in document.get("groups", []):
            for rule in group["rules"]:
                queries.append(Query(path.name, rule["alert"], rule["expr"]))
        for board in document.get("dashboards", []):
            for panel in board["panels"]:
                for expr in panel["exprs"]:
                    queries.append(Query(path.name, panel["title"], expr))
        for rules in document.get("alerts", []):
            for rule in rules["rules"]:
                queries.append(Query(path.name, rule["alert"], rule["expr"]))
    return queries


Page = dict[str, list[dict[str, str]]]
"""Sample name -> the label sets of its samples."""


def read_page(text: str) -> Page:
    page: Page = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            page.setdefault(sample.name, []).append(sample.labels)
    return page


def unmet(selector: Selector, page: Page) -> list[str]:
    """What `page` lacks for `selector`: the series, a sample its matchers
    accept, or a label it is grouped or joined on."""
    samples = page.get(selector.name)
    if not samples:
        return [f"no series {selector.name}"]
    missing = []
    matchers = [m for m in selector.matchers if m.label not in TARGET_LABELS]
    if not any(all(m.accepts(labels.get(m.label, "")) for m in matchers) for labels in samples):
        shown = ",".join(f"{m.label}{m.op}{m.value!r}" for m in matchers)
        missing.append(f"no {selector.name} sample matching {{{shown}}}")
    for matcher in matchers:
        if matcher.variable and not any(matcher.label in labels for labels in samples):
            missing.append(f"{selector.name} has no label {matcher.label}")
    for label in sorted(selector.grouped - TARGET_LABELS):
        if not any(label in labels for labels in samples):
            missing.append(f"{selector.name} has no label {label} to group on")
    return missing
