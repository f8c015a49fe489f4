"""The `dataLayer` section: metrics sources and their extractors, endpoint
discovery, and the reference's default source when none is declared (see
`epp.config.datalayer` for the settings each plugin becomes)."""

from __future__ import annotations

from typing import Any

from epp.config.datalayer import DEFAULT_SOURCES, DataLayerConfig, DataSourceConfig
from epp.config.plugin import Kind
from epp.config.sections.plugins import ConfigReader, Declared, referenced


def read_data_layer(
    reader: ConfigReader, value: Any, plugins: dict[str, Declared]
) -> DataLayerConfig:
    fields = reader.mapping(
        value,
        "dataLayer",
        {
            "sources",
            "discovery",
            "injectDefaults",
            "peerDiscovery",
            "crossReplicaSyncerPluginRef",
            "crossReplicaSyncInterval",
        },
    )
    sources: list[DataSourceConfig] = []
    for index, entry in enumerate(reader.sequence(fields.get("sources"), "dataLayer.sources")):
        path = f"dataLayer.sources[{index}]"
        source_fields = reader.mapping(entry, path, {"pluginRef", "extractors"})
        source = referenced(reader, source_fields.get("pluginRef"), f"{path}.pluginRef", plugins)
        extractors = []
        for position, item in enumerate(
            reader.sequence(source_fields.get("extractors"), f"{path}.extractors")
        ):
            where = f"{path}.extractors[{position}]"
            ref = reader.mapping(item, where, {"pluginRef"}).get("pluginRef")
            extractor = referenced(reader, ref, f"{where}.pluginRef", plugins)
            if extractor is not None:
                extractors.append((ref, extractor.value))
        if source is None:
            continue
        if source.kind is not Kind.DATA_SOURCE:
            reader.fail(f"{path}.pluginRef", f"{source.type} is not a data source")
            continue
        sources.append(
            DataSourceConfig(
                source_fields["pluginRef"], source.type, source.value, tuple(extractors)
            )
        )
    discovery = None
    if fields.get("discovery") is not None:
        ref = reader.mapping(fields["discovery"], "dataLayer.discovery", {"pluginRef"}).get(
            "pluginRef"
        )
        found = referenced(reader, ref, "dataLayer.discovery.pluginRef", plugins)
        if found is not None:
            if found.kind is not Kind.DISCOVERY:
                reader.fail(
                    "dataLayer.discovery.pluginRef", f"{found.type} is not a discovery plugin"
                )
            else:
                discovery = (ref, found.value)
    for unsupported in ("peerDiscovery", "crossReplicaSyncerPluginRef"):
        if fields.get(unsupported):
            reader.unsupported = True
            reader.fail(
                f"dataLayer.{unsupported}", "not supported by epp: one EPP replica owns its state"
            )
    if fields.get("crossReplicaSyncInterval") is not None:
        reader.duration(
            fields["crossReplicaSyncInterval"], "dataLayer.crossReplicaSyncInterval", None
        )
    inject = reader.boolean(fields.get("injectDefaults"), "dataLayer.injectDefaults", True)
    if inject and not any(source.type == "metrics-data-source" for source in sources):
        sources.extend(DEFAULT_SOURCES)
    return DataLayerConfig(tuple(sources), discovery)
