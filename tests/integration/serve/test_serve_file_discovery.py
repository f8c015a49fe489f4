"""The configuration's file-discovery plugin gives file mode its endpoints,
as `--endpoints @FILE` does."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.serving import serving

ENDPOINTS = {
    "endpoints": [
        {
            "name": "a",
            "address": "127.0.0.1",
            "port": "18001",
            "labels": {"llm-d.ai/role": "decode"},
        },
        {"name": "b", "address": "127.0.0.1", "port": "18002"},
    ]
}


def config(path: Path, endpoints: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "llm-d.ai/v1alpha1",
                "kind": "EndpointPickerConfig",
                "plugins": [
                    {"type": "file-discovery", "parameters": {"path": str(endpoints)}},
                ],
                "dataLayer": {"discovery": {"pluginRef": "file-discovery"}},
            }
        )
    )
    return path


async def test_file_discovery_supplies_the_endpoints_with_their_labels(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(yaml.safe_dump(ENDPOINTS))
    async with serving(
        config_file=str(config(tmp_path / "epp.yaml", endpoints)), secure_serving=False
    ) as server:
        snapshot = server.store.snapshot()
        assert sorted(e.address for e in snapshot.endpoints) == [
            "127.0.0.1:18001",
            "127.0.0.1:18002",
        ]
        labelled = next(e for e in snapshot.endpoints if e.address.endswith("18001"))
        assert labelled.labels["llm-d.ai/role"] == "decode"
