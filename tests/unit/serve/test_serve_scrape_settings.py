"""The scraper's source and engines, from the configuration's data layer."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.engines import ENGINES, Series
from epp.datalayer.scraper import MetricsSource
from epp.serve.inputs import StartupError, scrape_settings

EXTRACTOR_REF = [{"pluginRef": "core-metrics-extractor"}]


def config(source: dict[str, Any] | None = None, core: dict[str, Any] | None = None) -> dict:
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "metrics-data-source", "parameters": source or {}},
            {"type": "core-metrics-extractor", "parameters": core or {}},
        ],
        "dataLayer": {
            "sources": [{"pluginRef": "metrics-data-source", "extractors": EXTRACTOR_REF}]
        },
    }


def settings(document: dict[str, Any]):
    found = scrape_settings(parse_config(document).data_layer)
    assert found is not None
    return found


def test_the_default_data_layer_reads_each_engines_path_with_vllm_as_default():
    source, engines = settings({"apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig"})
    assert source == MetricsSource()
    assert source.path is None
    assert engines.engine_name({}) == "vllm"


def test_metrics_data_source_parameters_become_the_source():
    source, _ = settings(
        config(
            {
                "scheme": "https",
                "path": "/stats",
                "port": 9400,
                "insecureSkipVerify": False,
                "caCertPath": "/etc/ca.pem",
                "interval": "1s",
            }
        )
    )
    assert source == MetricsSource(
        scheme="https",
        path="/stats",
        port=9400,
        verify_tls=True,
        ca_cert_path="/etc/ca.pem",
        interval=1.0,
    )


def test_the_reference_default_path_means_each_engines_own():
    source, _ = settings(config({"path": "/metrics"}))
    assert source.path is None


def test_core_metrics_extractor_names_the_default_engine_and_the_label():
    _, engines = settings(
        config(core={"defaultEngine": "trtllm-serve", "engineLabelKey": "example.com/engine"})
    )
    assert engines.engine_name({}) == "trtllm-serve"
    assert engines.engine_name({"example.com/engine": "sglang"}) == "sglang"


def test_a_custom_engine_is_read_from_its_metric_specs():
    custom = {
        "name": "my-engine",
        "queuedRequestsSpec": "custom_queue_size{status=waiting}",
        "runningRequestsSpec": "custom_running",
        "kvUsageSpec": "custom_kv",
        "cacheBlockSizeSpec": "custom_block_size",
    }
    _, engines = settings(config(core={"engineConfigs": [custom], "defaultEngine": "my-engine"}))
    names = engines.names_for({})
    assert names.waiting == (Series("custom_queue_size", (("status", "waiting"),)),)
    assert names.block_size_gauge == Series("custom_block_size")
    assert engines.names_for({"llm-d.ai/engine-type": "vllm"}) is ENGINES["vllm"]


def test_a_bad_custom_spec_is_refused_at_load_naming_its_field():
    custom = {"name": "e", "kvUsageSpec": "kv{broken"}
    with pytest.raises(ConfigError, match=r"engineConfigs\[0\]\.kvUsageSpec"):
        parse_config(config(core={"engineConfigs": [custom]}))


def test_no_metrics_source_means_no_scraping():
    document = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "dataLayer": {"injectDefaults": False},
    }
    assert scrape_settings(parse_config(document).data_layer) is None


def test_two_metrics_sources_are_refused_at_start():
    document = config()
    document["plugins"].append({"type": "metrics-data-source", "name": "second"})
    document["dataLayer"]["sources"].append({"pluginRef": "second"})
    with pytest.raises(StartupError, match="one metrics-data-source"):
        scrape_settings(parse_config(document).data_layer)
