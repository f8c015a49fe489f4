"""The `dataLayer` section and the data-layer plugins' settings, as plain
values for `epp.datalayer` to consume.

`metrics-data-source` and `core-metrics-extractor` parameters become
`MetricsSourceSettings` and `CoreMetricsSettings`; `dataLayer.sources`
pairs each source with its extractors in order. Without a metrics source
(and unless `injectDefaults: false`) the reference adds one with its
defaults and a core-metrics-extractor, so `DataLayerConfig()` is that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.datalayer.engines import ENGINES as ENGINE_TABLES

ENGINES = tuple(ENGINE_TABLES)
"""The engines the core-metrics-extractor knows without `engineConfigs`."""


@dataclass(slots=True, frozen=True)
class HttpSourceSettings:
    """What the http data sources share: how each pod's page is fetched
    (scheme, path, TLS). `interval` None: `--refresh-metrics-interval`."""

    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True
    ca_cert_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""
    interval: float | None = None


@dataclass(slots=True, frozen=True)
class MetricsSourceSettings(HttpSourceSettings):
    """How each pod's Prometheus metrics are read. `port` None: the pod's
    serving port."""

    port: int | None = None


@dataclass(slots=True, frozen=True)
class ModelsSourceSettings(HttpSourceSettings):
    """How each pod's model list (`GET /v1/models`) is read, for the
    `models-responder`."""

    path: str = "/v1/models"


@dataclass(slots=True, frozen=True)
class CoreMetricsSettings:
    """Which engine's metric names a pod is read with: the pod label
    `engine_label_key` names it, `default_engine` when absent. Custom
    engines (`engineConfigs`) and `customMetrics` are kept as written."""

    engine_label_key: str = "llm-d.ai/engine-type"
    default_engine: str = "vllm"
    engine_configs: tuple[Mapping[str, Any], ...] = ()
    custom_metrics: tuple[Mapping[str, Any], ...] = ()


@dataclass(slots=True, frozen=True)
class DataSourceConfig:
    """One `dataLayer.sources` entry: the source plugin (its settings when
    it is a metrics source) and its extractors' settings, in order."""

    name: str
    type: str
    settings: Any
    extractors: tuple[tuple[str, Any], ...] = ()
    """(plugin name, settings) per extractor."""


DEFAULT_SOURCES = (
    DataSourceConfig(
        "metrics-data-source",
        "metrics-data-source",
        MetricsSourceSettings(),
        (("core-metrics-extractor", CoreMetricsSettings()),),
    ),
)


@dataclass(slots=True, frozen=True)
class DataLayerConfig:
    sources: tuple[DataSourceConfig, ...] = DEFAULT_SOURCES
    discovery: tuple[str, Any] | None = None
    """(plugin name, settings) of the endpoint discovery plugin, if any."""

    def metrics_sources(self) -> list[DataSourceConfig]:
        return [
            source for source in self.sources if isinstance(source.settings, MetricsSourceSettings)
        ]


@dataclass(slots=True, frozen=True)
class FileDiscovery:
    """`file-discovery`: endpoints from a file in the reference's format
    (what `epp serve --endpoints @FILE` reads), reloaded on change when
    `watch_file`."""

    path: str
    watch_file: bool = False


def file_discovery(parameters: Mapping[str, Any]) -> FileDiscovery:
    """The `file-discovery` factory."""
    return FileDiscovery(parameters["path"], parameters["watchFile"])


def metrics_source(parameters: Mapping[str, Any]) -> MetricsSourceSettings:
    """The `metrics-data-source` factory."""
    return MetricsSourceSettings(port=parameters["port"], **_http_source(parameters))


def models_source(parameters: Mapping[str, Any]) -> ModelsSourceSettings:
    """The `models-data-source` factory."""
    return ModelsSourceSettings(**_http_source(parameters))


def _http_source(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The settings both http sources share, from their parameters."""
    return {
        "scheme": parameters["scheme"],
        "path": parameters["path"],
        "insecure_skip_verify": parameters["insecureSkipVerify"],
        "ca_cert_path": parameters["caCertPath"],
        "client_cert_path": parameters["clientCertPath"],
        "client_key_path": parameters["clientKeyPath"],
        "interval": parameters["interval"],
    }


def core_metrics(parameters: Mapping[str, Any]) -> CoreMetricsSettings:
    """The `core-metrics-extractor` factory."""
    from epp.config.plugin import ParameterError
    from epp.datalayer.engines import engine_from_config

    engines = parameters["engineConfigs"] or ()
    if not isinstance(engines, list | tuple):
        raise ParameterError("engineConfigs", "must be a list of engine configurations")
    names = {engine.get("name") for engine in engines if isinstance(engine, Mapping)}
    if len(names) != len(engines) or None in names:
        raise ParameterError("engineConfigs", "each entry needs a distinct name")
    default = parameters["defaultEngine"]
    if default not in ENGINES and default not in names:
        known = ", ".join([*ENGINES, *sorted(n for n in names if isinstance(n, str))])
        raise ParameterError("defaultEngine", f"unknown engine {default!r}; known: {known}")
    for index, engine in enumerate(engines):
        try:
            engine_from_config(engine)
        except ValueError as error:
            field, _, message = str(error).partition(": ")
            raise ParameterError(f"engineConfigs[{index}].{field}", message) from None
    custom = parameters["customMetrics"] or ()
    if not isinstance(custom, list | tuple):
        raise ParameterError("customMetrics", "must be a list")
    return CoreMetricsSettings(parameters["engineLabelKey"], default, tuple(engines), tuple(custom))
