"""Where `epp serve`'s inputs come from, read before anything runs: the
endpoints of `--endpoints` (inline or a file), the pool when no `--pool`
file is given, the scraper's settings from the configuration's data layer,
and the configuration's file discovery as `--endpoints`. A failure is a
`StartupError` naming what is wrong.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from epp import defaults
from epp.api.manifests import load_pool
from epp.api.models import InferencePool
from epp.config.datalayer import (
    CoreMetricsSettings,
    DataLayerConfig,
    FileDiscovery,
    HttpSourceSettings,
    MetricsSourceSettings,
)
from epp.datalayer.endpoints import (
    EndpointSpec,
    parse_endpoints_document,
    parse_static_endpoints,
)
from epp.datalayer.engines import EngineLookup
from epp.datalayer.scraper import MetricsSource
from epp.serve.options import ServeOptions

log = logging.getLogger("epp.serve.inputs")


class StartupError(Exception):
    """The options or the files they name cannot make a working EPP."""


ENDPOINTS_DOCUMENT = re.compile(r"^\s*(endpoints\s*:|\{)", re.MULTILINE)


def read_endpoints(value: str) -> list[EndpointSpec]:
    """The endpoints of `--endpoints`: an inline list, or `@FILE` holding such
    a list or an endpoints document (`endpoints:` entries with labels, the
    reference's file-discovery format). An empty list is allowed (the pool
    has no endpoints for now)."""
    text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
    if value.startswith("@") and ENDPOINTS_DOCUMENT.search(text):
        return parse_endpoints_document(text)
    entries = ",".join(
        line.split("#", 1)[0].replace(" ", ",") for line in text.replace(",", "\n").splitlines()
    )
    if not entries.strip(", "):
        return []
    return parse_static_endpoints(entries)


def fetched_as(settings: HttpSourceSettings, **where: Any) -> MetricsSource:
    """An http data source's scheme and TLS as the page fetchers take them;
    `where`: the rest of the `MetricsSource` (path, port, interval)."""
    return MetricsSource(
        scheme=settings.scheme,
        verify_tls=not settings.insecure_skip_verify,
        ca_cert_path=settings.ca_cert_path or None,
        client_cert_path=settings.client_cert_path or None,
        client_key_path=settings.client_key_path or None,
        **where,
    )


def scrape_settings(data_layer: DataLayerConfig) -> tuple[MetricsSource, EngineLookup] | None:
    """The scraper's source and engine lookup from the configuration's
    metrics-data-source and its core-metrics-extractor (None: no metrics
    source). The reference's default path `/metrics` means each engine's
    own (trtllm-serve's Prometheus text is at `/prometheus/metrics`)."""
    sources = data_layer.metrics_sources()
    if not sources:
        return None
    if len(sources) > 1:
        names = ", ".join(source.name for source in sources)
        raise StartupError(f"epp reads one metrics-data-source; the configuration has {names}")
    settings: MetricsSourceSettings = sources[0].settings
    source = fetched_as(
        settings,
        path=None if settings.path == "/metrics" else settings.path,
        port=settings.port,
        interval=settings.interval,
    )
    extractors = [s for _, s in sources[0].extractors if isinstance(s, CoreMetricsSettings)]
    core = extractors[0] if extractors else CoreMetricsSettings()
    if core.custom_metrics:
        log.warning("core-metrics-extractor: customMetrics are not read by epp")
    try:
        engines = EngineLookup.from_configs(
            core.default_engine, core.engine_label_key, core.engine_configs
        )
    except ValueError as error:
        raise StartupError(f"core-metrics-extractor: {error}") from None
    return source, engines


def synthesized_pool(name: str, namespace: str) -> InferencePool:
    """The pool when no --pool file is given: a name, a namespace, no labels."""
    return InferencePool(name=name, namespace=namespace)


def initial_pool(options: ServeOptions) -> InferencePool:
    if options.pool_file is not None:
        return load_pool(options.pool_file)
    if options.pool_name is None and not options.objectives:
        return load_pool(defaults.POOL)
    return synthesized_pool(options.pool_name or "default", options.namespace)


def with_file_discovery(options: ServeOptions, discovery: FileDiscovery) -> ServeOptions:
    """The configuration's file-discovery as `--endpoints @FILE` (the flag wins)."""
    if options.endpoints is not None:
        log.warning("--endpoints given: the configuration's file-discovery is not used")
        return options
    return replace(options, endpoints=f"@{discovery.path}")
