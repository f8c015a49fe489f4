"""epp serve with the precise prefix cache: it subscribes to each endpoint's
KV-cache events (a vLLM-shaped publisher on loopback) and places requests by
the blocks the servers reported."""

from __future__ import annotations

from pathlib import Path

from epp.demo.kv_publisher import KVEventPublisher, cleared, stored
from epp.scheduling.endpoint import Endpoint
from epp.scheduling.kvblocks import BlockHasher
from epp.scheduling.request import InferenceRequest
from tests.support.serving import serving
from tests.support.waiting import eventually

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 16, hashSeed: "42"}}
    kvEventsConfig:
      podDiscoveryConfig: {{socketPort: {port}, replaySocketPort: {replay}}}
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
"""
TOKENS = list(range(500, 500 + 16 * 4))


async def test_serve_places_by_the_blocks_a_server_published(tmp_path: Path) -> None:
    hasher = BlockHasher(16, "42")
    async with KVEventPublisher("127.0.0.2", 0, "kv@127.0.0.2@m", replay_port=0) as publisher:
        await publisher.publish([stored(hasher.keys(TOKENS), None, TOKENS, 16)])
        config = tmp_path / "epp.yaml"
        config.write_text(CONFIG.format(port=publisher.port, replay=publisher.replay_port))
        async with serving(
            config_file=str(config), endpoints="127.0.0.1:8000,127.0.0.2:8000"
        ) as server:
            index = server.core.kv_index
            assert index is not None
            await eventually(lambda: index.held_by("127.0.0.2:8000") == 4)
            assert server.kv_subscribers.stats.active == 2
            for _ in range(4):
                chosen = server.core.scheduler.choose(InferenceRequest("m", "m", token_ids=TOKENS))
                assert isinstance(chosen, Endpoint)
                assert chosen.address == "127.0.0.2:8000"
            text = server.metrics.exposition().decode()
            assert "llm_d_epp_kv_cache_index_admissions_total 4.0" in text
            assert "kvcache_index_admissions_total 4.0" in text
            assert "llm_d_epp_kv_cache_index_blocks 4.0" in text
            assert "llm_d_epp_kv_cache_events_active_subscribers 2.0" in text
            assert 'llm_d_epp_kv_cache_events_applied_total{type="BlockStored"} 1.0' in text
            assert "llm_d_epp_kv_cache_index_lookup_requests_total 4.0" in text
            assert "llm_d_epp_kv_cache_index_former_blocks 0.0" in text

            await publisher.publish([cleared()])  # the server restarted
            await eventually(lambda: index.held_by("127.0.0.2:8000") == 0)
            text = server.metrics.exposition().decode()
            assert "llm_d_epp_kv_cache_index_former_blocks 4.0" in text
            longer = [*TOKENS, *range(16)]  # a session's next turn goes back there
            chosen = server.core.scheduler.choose(InferenceRequest("m", "m", token_ids=longer))
            assert isinstance(chosen, Endpoint) and chosen.address == "127.0.0.2:8000"
