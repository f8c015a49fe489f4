"""Data-layer plugin types: sources, extractors and discovery, with the
reference's parameter names, types and defaults
(`pkg/epp/framework/plugins/datalayer/`)."""

from __future__ import annotations

from epp.config.catalog import ALPHA, T
from epp.config.datalayer import core_metrics, file_discovery, metrics_source, models_source
from epp.config.plugin import (
    MULTICLUSTER_UNSUPPORTED,
    Kind,
    Param,
    PluginType,
    configured,
)

PART3 = "issue #14, data layer"

TLS_PARAMS = (
    Param("insecureSkipVerify", T.BOOL, True, "skip TLS verification with https"),
    Param("caCertPath", T.STRING, ""),
    Param("clientCertPath", T.STRING, ""),
    Param("clientKeyPath", T.STRING, ""),
)
"""How an http source reads a pod over https (`metrics-data-source`, `models-data-source`)."""

ENTRIES: tuple[PluginType, ...] = (
    PluginType(
        "metrics-data-source",
        Kind.DATA_SOURCE,
        "scrapes each pod's Prometheus metrics",
        (
            Param("scheme", T.STRING, "http", "", choices=("http", "https")),
            Param("path", T.STRING, "/metrics"),
            Param("port", T.INT, None, "scrape port; default the pod's serving port", 1, 65535),
            *TLS_PARAMS,
            Param(
                "interval",
                T.DURATION,
                None,
                "scrape period; default --refresh-metrics-interval",
                0,
                None,
                True,
            ),
        ),
        factory=metrics_source,
    ),
    PluginType(
        "core-metrics-extractor",
        Kind.EXTRACTOR,
        "reads queue, running, KV-cache and LoRA metrics per engine "
        "(vllm, sglang, trtllm-serve, triton-tensorrt-llm)",
        (
            Param(
                "engineLabelKey", T.STRING, "llm-d.ai/engine-type", "pod label naming the engine"
            ),
            Param("defaultEngine", T.STRING, "vllm", "engine of an unlabelled pod"),
            Param("engineConfigs", T.ANY, (), "custom engines: name and metric specs"),
            Param("customMetrics", T.ANY, (), "extra metrics to read"),
        ),
        factory=core_metrics,
    ),
    PluginType(
        "endpoint-notification-source",
        Kind.DATA_SOURCE,
        "tells extractors when pods are added or removed",
        factory=configured,
    ),
    PluginType(
        "k8s-notification-source",
        Kind.DATA_SOURCE,
        "watches a Kubernetes kind and tells extractors of changes",
        (
            Param("group", T.STRING, ""),
            Param("version", T.STRING, "", required=True),
            Param("kind", T.STRING, "", required=True),
        ),
        refusal="watches of arbitrary Kubernetes kinds are not supported by epp",
    ),
    PluginType(
        "file-discovery",
        Kind.DISCOVERY,
        "endpoints from a file instead of the pool's pods",
        (
            Param("path", T.STRING, required=True),
            Param("watchFile", T.BOOL, False, "reload the file when it changes"),
        ),
        factory=file_discovery,
    ),
    PluginType(
        "models-data-source",
        Kind.DATA_SOURCE,
        "polls each pod's /v1/models for the models-responder (which creates one with "
        "these defaults when none is declared)",
        (
            Param("scheme", T.STRING, "http", "", choices=("http", "https")),
            Param("path", T.STRING, "/v1/models"),
            *TLS_PARAMS,
            Param(
                "interval",
                T.DURATION,
                None,
                "poll period; default --refresh-metrics-interval",
                0,
                None,
                True,
            ),
        ),
        factory=models_source,
    ),
    PluginType(
        "models-data-extractor",
        Kind.EXTRACTOR,
        "keeps each pod's model list from a models-data-source",
        factory=configured,
    ),
    PluginType(
        "dcgm-data-source",
        Kind.DATA_SOURCE,
        "scrapes NVIDIA DCGM exporter GPU metrics",
        refusal="needs the NVIDIA DCGM exporter's GPU metrics, which epp does not scrape",
        stability=ALPHA,
    ),
    PluginType(
        "dcgm-extractor",
        Kind.EXTRACTOR,
        "reads NVIDIA DCGM GPU metrics",
        refusal="needs the NVIDIA DCGM exporter's GPU metrics, which epp does not scrape",
        stability=ALPHA,
    ),
    PluginType(
        "topology-extractor",
        Kind.EXTRACTOR,
        "reads node topology labels",
        refusal="node topology is not collected by epp",
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-file-discovery",
        Kind.DISCOVERY,
        "peer clusters from a file",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-metrics-data-source",
        Kind.DATA_SOURCE,
        "scrapes clusters' pool metrics",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
    PluginType(
        "multicluster-metrics-extractor",
        Kind.EXTRACTOR,
        "reads clusters' pool metrics",
        refusal=MULTICLUSTER_UNSUPPORTED,
        stability=ALPHA,
    ),
)
