"""Did the EPP see the model servers' load, and how late? A watch over a live run.

Every `period` seconds the watch reads each model server's own metrics page
(at its engine's path, with the EPP's own reader: the truth at that moment)
and then the EPP's `/metrics` (its per-pod view: queue, KV use, and the age
of its latest read of each pod). The summary gives, per pod and overall,
the peaks each side saw, how often the EPP's queue was within one request
of the server's, and the age of the EPP's view against the scrape interval.

The EPP's view of a pod is one interval old just before its next read
starts, and older by that read's time until it completes: at most the
interval plus one read. A read's time is measured beside it, as the watch's
own read of the same pages at that moment (`read_s`: the servers, Envoy,
the load and the EPP share the machine's cores, so under load a read takes
tens of milliseconds), and taken as at least `READ_FLOOR_S`, since the
EPP's own reads wait behind the requests it routes. The EPP saw the load
"within one scrape interval" when the 99th percentile of the view's age is
at most the interval plus the 99th percentile of a read's time
(`slack_s`); the maximum is shown beside it, and a single stall of the
machine does not make a healthy run fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp.datalayer.engines import ENGINES
from epp.datalayer.reader import MetricsReader

READ_FLOOR_S = 0.05
"""The least time a read of a pod's page is taken to need (see the module docstring)."""

EPP_VIEW = {
    "llm_d_epp_per_endpoint_queue_size": "waiting",
    "epp_per_endpoint_kv_cache_utilization": "kv_usage",
    "epp_per_endpoint_metrics_age_seconds": "age_s",
}


@dataclass(slots=True, frozen=True)
class PodSample:
    at: float
    pod: str
    server_waiting: float
    server_kv: float
    epp_waiting: float
    epp_kv: float
    epp_age_s: float
    read_s: float
    """How long the watch took to read the servers' pages for this sample."""


def epp_view(text: str) -> dict[str, dict[str, float]]:
    """Per endpoint (`model_server_endpoint`), the EPP's queue, KV use and view age."""
    view: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = EPP_VIEW.get(sample.name)
            if field is not None:
                view.setdefault(sample.labels["model_server_endpoint"], {})[field] = sample.value
    return view


class LoadWatch:
    """Samples both sides while a run plays; `async with` starts and stops it."""

    def __init__(
        self, pods: list[str], engine: str, epp_metrics_url: str, period: float = 0.2
    ) -> None:
        self.pods = pods
        self.names = ENGINES[engine]
        self.epp_metrics_url = epp_metrics_url
        self.period = period
        self.samples: list[PodSample] = []
        self.errors = 0
        self._readers = {pod: MetricsReader() for pod in pods}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoadWatch:
        self._task = asyncio.create_task(self._run(), name="load watch")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                started = time.monotonic()
                try:
                    await self._sample(session, started)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    self.errors += 1
                await asyncio.sleep(max(0.0, self.period - (time.monotonic() - started)))

    async def _sample(self, session: aiohttp.ClientSession, at: float) -> None:
        pages = await asyncio.gather(
            *(self._get(session, f"http://{pod}{self.names.metrics_path}") for pod in self.pods)
        )
        read_s = time.monotonic() - at
        view = epp_view(await self._get(session, self.epp_metrics_url))
        for pod, page in zip(self.pods, pages, strict=True):
            truth = self._readers[pod].read(page, self.names, at)
            seen = view.get(pod)
            if seen is None or "age_s" not in seen:
                continue
            self.samples.append(
                PodSample(
                    at,
                    pod,
                    truth.waiting,
                    truth.kv_usage,
                    seen.get("waiting", 0.0),
                    seen.get("kv_usage", 0.0),
                    seen["age_s"],
                    read_s,
                )
            )

    @staticmethod
    async def _get(session: aiohttp.ClientSession, url: str) -> str:
        async with session.get(url) as response:
            response.raise_for_status()
            return await response.text()


def percentile(ordered: list[float], share: float) -> float:
    """The value of `ordered` (ascending) at `share` of the way (nearest rank)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def summarize(samples: list[PodSample], scrape_interval_s: float) -> dict[str, Any]:
    """The watch's numbers for the report (see the module docstring)."""
    if not samples:
        return {"samples": 0}
    ages = sorted(sample.epp_age_s for sample in samples)
    slack_s = max(READ_FLOOR_S, percentile(sorted(sample.read_s for sample in samples), 0.99))
    pods: dict[str, Any] = {}
    for pod in sorted({sample.pod for sample in samples}):
        mine = [sample for sample in samples if sample.pod == pod]
        pods[pod] = {
            "samples": len(mine),
            "server_peak_queue": max(s.server_waiting for s in mine),
            "epp_peak_queue": max(s.epp_waiting for s in mine),
            "server_peak_kv": max(s.server_kv for s in mine),
            "epp_peak_kv": max(s.epp_kv for s in mine),
        }
    bound = scrape_interval_s + slack_s
    return {
        "samples": len(samples),
        "scrape_interval_s": scrape_interval_s,
        "slack_s": slack_s,
        "view_age_p50_s": percentile(ages, 0.5),
        "view_age_p99_s": percentile(ages, 0.99),
        "view_age_max_s": ages[-1],
        "queue_within_one_request": sum(abs(s.epp_waiting - s.server_waiting) <= 1 for s in samples)
        / len(samples),
        "kv_within_0.05": sum(abs(s.epp_kv - s.server_kv) <= 0.05 for s in samples) / len(samples),
        "seen_within_one_interval": percentile(ages, 0.99) <= bound,
        "saw_load": any(s.epp_waiting > 0 or s.epp_kv > 0 for s in samples),
        "pods": pods,
    }


def render(summary: dict[str, Any], engine: str) -> list[str]:
    if not summary.get("samples"):
        return [f"EPP's view of the {engine} servers: no samples"]
    interval_ms = summary["scrape_interval_s"] * 1000
    lines = [
        f"EPP's view of the {engine} servers ({summary['samples']} samples, "
        f"scrape every {interval_ms:g} ms): view age p50 "
        f"{summary['view_age_p50_s'] * 1000:.0f} ms, p99 {summary['view_age_p99_s'] * 1000:.0f} ms"
        f" -> {'within' if summary['seen_within_one_interval'] else 'NOT within'} one interval"
        f" and one read (p99 {summary['slack_s'] * 1000:.0f} ms); max"
        f" {summary['view_age_max_s'] * 1000:.0f} ms;"
        f" queue within 1 request {summary['queue_within_one_request']:.0%},"
        f" KV within 0.05 {summary['kv_within_0.05']:.0%}",
    ]
    for pod, numbers in summary["pods"].items():
        lines.append(
            f"  {pod}: peak queue server {numbers['server_peak_queue']:g} / EPP "
            f"{numbers['epp_peak_queue']:g}, peak KV server {numbers['server_peak_kv']:.2f} / "
            f"EPP {numbers['epp_peak_kv']:.2f}"
        )
    return lines
