"""The precise prefix-cache pipeline across the `plugins` section: the one
`token-producer` and the one `precise-prefix-cache-producer` declared, as
the core's part (`SchedulingConfig.precise`) and the shell's
(`EppConfig.tokenizer`, `EppConfig.kv_events`); see `epp.config.precise`."""

from __future__ import annotations

from dataclasses import dataclass, replace

from epp.config.precise import (
    KVEventsSettings,
    PreciseProducer,
    TokenizerBackend,
    TokenizerSettings,
)
from epp.config.sections.plugins import ConfigReader, Declared
from epp.scheduling.kvblocks import PreciseConfig


@dataclass(slots=True, frozen=True)
class PrecisePipeline:
    """The declared pipeline: the core's producer (None without one), the
    token producer and the event subscribers' settings."""

    precise: PreciseConfig | None = None
    tokenizer: TokenizerSettings | None = None
    kv_events: KVEventsSettings | None = None


def read_precise(reader: ConfigReader, plugins: dict[str, Declared]) -> PrecisePipeline:
    """The pipeline of the declared plugins; at most one of each producer."""
    producers = [(n, p.value) for n, p in plugins.items() if isinstance(p.value, PreciseProducer)]
    tokenizers = [
        (n, p.value) for n, p in plugins.items() if isinstance(p.value, TokenizerSettings)
    ]
    declared = (("precise-prefix-cache-producer", producers), ("token-producer", tokenizers))
    for kind, found in declared:
        if len(found) > 1:
            reader.fail("plugins", f"at most one {kind} may be declared, got {len(found)}")
    tokenizer = tokenizers[0][1] if tokenizers else None
    if not producers:
        return PrecisePipeline(tokenizer=tokenizer)
    name, producer = producers[0]
    if tokenizer is None or tokenizer.backend is TokenizerBackend.ESTIMATE:
        reader.warn(
            "plugins",
            f"{name}: without a token-producer backend that tokenizes (vllm, "
            "udsTokenizerConfig, local), no request has the servers' tokens: the precise "
            "prefix cache will match nothing",
        )
    return PrecisePipeline(replace(producer.precise, name=name), tokenizer, producer.events)
