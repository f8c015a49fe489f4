"""The `dataLayer` section: metrics sources and their extractors, endpoint
discovery (`discovery.endpoints` in llm-d.ai/v1, the bare `discovery.pluginRef`
of v1alpha1 still read), and the reference's default source when none is
declared (see `epp.config.datalayer` for the settings each plugin becomes).
Cross-replica state (`crossReplica` in v1, `crossReplica*` in v1alpha1) and
peer discovery are refused: one EPP replica owns its state."""

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
            "crossReplicaPublishTimeout",
            "crossReplica",
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
    discovery = _discovery(reader, fields.get("discovery"), plugins)
    cross = reader.mapping(
        fields.get("crossReplica"),
        "dataLayer.crossReplica",
        {"syncerPluginRef", "syncInterval", "publishTimeout"},
    )
    for unsupported, given in (
        ("peerDiscovery", fields.get("peerDiscovery")),
        ("crossReplicaSyncerPluginRef", fields.get("crossReplicaSyncerPluginRef")),
        ("crossReplica.syncerPluginRef", cross.get("syncerPluginRef")),
    ):
        if given:
            reader.unsupported = True
            reader.fail(
                f"dataLayer.{unsupported}", "not supported by epp: one EPP replica owns its state"
            )
    for where, given in (
        ("crossReplicaSyncInterval", fields.get("crossReplicaSyncInterval")),
        ("crossReplicaPublishTimeout", fields.get("crossReplicaPublishTimeout")),
        ("crossReplica.syncInterval", cross.get("syncInterval")),
        ("crossReplica.publishTimeout", cross.get("publishTimeout")),
    ):
        if given is not None:
            reader.duration(given, f"dataLayer.{where}", None)
    inject = reader.boolean(fields.get("injectDefaults"), "dataLayer.injectDefaults", True)
    if inject and not any(source.type == "metrics-data-source" for source in sources):
        sources.extend(DEFAULT_SOURCES)
    return DataLayerConfig(tuple(sources), discovery)


def _discovery(
    reader: ConfigReader, value: Any, plugins: dict[str, Declared]
) -> tuple[str, Any] | None:
    """`dataLayer.discovery`: `endpoints.pluginRef` (llm-d.ai/v1's place), or
    the bare `pluginRef` v1alpha1 had, deprecated; `peers` is refused."""
    if value is None:
        return None
    fields = reader.mapping(value, "dataLayer.discovery", {"pluginRef", "endpoints", "peers"})
    if fields.get("peers") is not None:
        reader.unsupported = True
        reader.fail(
            "dataLayer.discovery.peers", "not supported by epp: one EPP replica owns its state"
        )
    where = "dataLayer.discovery.endpoints.pluginRef"
    endpoints = reader.mapping(
        fields.get("endpoints"), "dataLayer.discovery.endpoints", {"pluginRef"}
    )
    ref = endpoints.get("pluginRef")
    if ref is None and "pluginRef" in fields:
        where, ref = "dataLayer.discovery.pluginRef", fields["pluginRef"]
        reader.warn(where, "deprecated; use dataLayer.discovery.endpoints.pluginRef")
    if ref is None:
        return None
    found = referenced(reader, ref, where, plugins)
    if found is None:
        return None
    if found.kind is not Kind.DISCOVERY:
        reader.fail(where, f"{found.type} is not a discovery plugin")
        return None
    return ref, found.value
