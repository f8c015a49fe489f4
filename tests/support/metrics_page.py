"""One reader of a Prometheus text page (the EPP's /metrics, a model
server's), through prometheus-client's parser, for tests and benches:

    page = await fetch_page(session, epp.metrics_url)
    page.total("epp_worker_requests_total")
    page.by_label("worker", "epp_worker_requests_total")
    MetricsPage.parse(metrics.exposition()).series("x_total", reason="timeout")
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line, with the family it stands in."""

    name: str
    """As written on the page: `x_total`, `x_bucket`, `x_sum`, ..."""
    labels: dict[str, str]
    value: float
    family: str
    """The family's name, without the `_total`/`_bucket` ending."""
    kind: str
    """The family's TYPE: counter, gauge, histogram, summary, info, unknown."""


@dataclass(frozen=True, slots=True)
class MetricsPage:
    samples: tuple[Sample, ...]
    """In page order."""
    families: dict[str, str]
    """Each family's name -> its TYPE, those without a sample included."""

    @classmethod
    def parse(cls, text: str | bytes) -> MetricsPage:
        if isinstance(text, bytes):
            text = text.decode()
        families = list(text_string_to_metric_families(text))
        return cls(
            tuple(
                Sample(sample.name, sample.labels, float(sample.value), family.name, family.type)
                for family in families
                for sample in family.samples
            ),
            {family.name: family.type for family in families},
        )

    def series(self, name: str, /, **labels: str) -> list[Sample]:
        """The samples named `name` whose labels include `labels`."""
        return [
            sample
            for sample in self.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        ]

    def total(self, name: str, /, **labels: str) -> float:
        """The sum of `series(name, **labels)`; 0 when there is none."""
        return sum(sample.value for sample in self.series(name, **labels))

    def by_label(self, label: str, name: str, /, **labels: str) -> dict[str, float]:
        """`series(name, **labels)`'s values by their `label` ('' where it is missing)."""
        return {
            sample.labels.get(label, ""): sample.value for sample in self.series(name, **labels)
        }


async def fetch_page(session: aiohttp.ClientSession, url: str) -> MetricsPage:
    """The page at `url`, which must answer 200."""
    async with session.get(url) as response:
        assert response.status == 200, f"{url}: {response.status}"
        return MetricsPage.parse(await response.text())
