"""Precise against approximate prefix routing, live through Envoy.

    python3 -m bench.precise_live [--seconds S] [--rate RPS] [--tokenizer local|render] [--json]

Four simulated vLLM servers (`epp.demo.model_server`, real time) on their own
loopback addresses publish their KV-cache events over ZMQ; `epp serve` with
`config/epp/precise-prefix.yaml` (precise) or `config/epp/default.yaml`
(approximate) behind a real Envoy, and round-robin straight to the servers
(a Kubernetes Service). The load is shared system prompts under KV pressure,
as `config/scenarios/precise-system-prompts.yaml`: GROUPS prompts of
PREFIX_TOKENS tokens and a tail of the request's own, Poisson arrivals,
streamed; each policy gets fresh servers. Hit rate: cached prompt tokens
over prompt tokens, summed over the servers; TTFT: the client's, to the
first streamed chunk.

Tokens: with `--tokenizer local` (the default) every server tokenizes with
a byte-level BPE trained on the run's prompts (`epp.demo.tokenizer_file`)
and the precise EPP's token producer loads the same tokenizer.json
(`local.modelDir`), tokenizing in process; with `render` the servers keep
their simulated tokenizer and the token producer asks the first server's
render endpoint (`vllm.url`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp.demo.compare import deployed_config
from epp.demo.envoy_process import running_envoy
from epp.demo.kv_publisher import KVEventsPublishing, port_free_on_every
from epp.demo.model_server import SimulatedServer
from epp.demo.model_servers import serving_on
from epp.demo.tokenizer_file import encoder, train
from epp.sim.server_model import ServerParams
from tests.support.epp_process import running_epp

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
MODEL = "model"
GROUPS = 16
PREFIX_TOKENS = 1500
TAIL_TOKENS = (50, 300)
PARAMS = ServerParams(
    max_num_seqs=16, prefill_ms_per_token=0.2, decode_ms_per_token=12, kv_blocks=500, block_size=16
)


def servers(
    events_port: int, tokenizer: Path | None
) -> contextlib.AbstractAsyncContextManager[list[SimulatedServer]]:
    publishing = KVEventsPublishing(events_port, None)
    tokenize = encoder(tokenizer) if tokenizer is not None else None
    pool = [SimulatedServer(PARAMS, MODEL, kv_events=publishing, tokenizer=tokenize) for _ in HOSTS]
    return serving_on(pool, HOSTS)


def workload(seconds: float, rate: float, seed: int) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    prefixes = [f"<system prompt {g:02d}|" * (PREFIX_TOKENS * 4 // 19 + 1) for g in range(GROUPS)]
    prefixes = [p[: PREFIX_TOKENS * 4] for p in prefixes]
    arrivals, at = [], rng.expovariate(rate)
    while at < seconds:
        tail = rng.randint(*TAIL_TOKENS) * 4
        text = prefixes[rng.randrange(GROUPS)] + "".join(
            rng.choice("abcdefghijklmnop ") for _ in range(tail)
        )
        arrivals.append((at, text))
        at += rng.expovariate(rate)
    return arrivals


async def drive(urls: list[str], arrivals: list[tuple[float, str]]) -> list[float]:
    """Send each arrival at its time (round-robin over `urls`); each one's TTFT."""
    ttfts: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(index: int, text: str) -> None:
            body = {"model": MODEL, "prompt": text, "max_tokens": 20, "stream": True}
            sent = time.perf_counter()
            async with session.post(urls[index % len(urls)], json=body) as response:
                first = None
                async for _ in response.content.iter_any():
                    if first is None:
                        first = time.perf_counter() - sent
                if response.status == 200 and first is not None:
                    ttfts.append(first)

        start = time.perf_counter()
        tasks = []
        for index, (at, text) in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index, text)))
        await asyncio.gather(*tasks)
    return ttfts


def summary(pool: list[SimulatedServer], ttfts: list[float], sent: int) -> dict[str, Any]:
    models = [server.model.model for server in pool if server.model is not None]
    prompt = sum(model.prompt_tokens for model in models)
    ordered = sorted(ttfts)
    return {
        "requests": sent,
        "per_server": [server.model.admitted_total for server in pool if server.model is not None],
        "completed": len(ttfts),
        "hit_rate": sum(model.cached_tokens for model in models) / prompt if prompt else 0.0,
        "ttft_p50_s": statistics.median(ordered) if ordered else float("nan"),
        "ttft_p90_s": ordered[int(0.9 * (len(ordered) - 1))] if ordered else float("nan"),
    }


async def run(
    policy: str, arrivals: list[tuple[float, str]], tokenizer: Path | None
) -> dict[str, Any]:
    events_port = port_free_on_every(HOSTS)
    async with servers(events_port, tokenizer) as pool:
        addresses = [f"{host}:{server.port}" for host, server in zip(HOSTS, pool, strict=True)]
        if policy == "round-robin":
            urls = [f"http://{address}/v1/completions" for address in addresses]
            return summary(pool, await drive(urls, arrivals), len(arrivals))
        with tempfile.TemporaryDirectory() as folder:
            config = (
                deployed_config(
                    ROOT / "config" / "epp" / "precise-prefix.yaml",
                    Path(folder),
                    MODEL,
                    events_port,
                    tokenizer,
                    f"http://{addresses[0]}",
                )
                if policy == "precise"
                else ROOT / "config" / "epp" / "default.yaml"
            )
            async with (
                running_epp(f"--config-file={config}", f"--endpoints={','.join(addresses)}") as epp,
                running_envoy(epp_port=epp.ports["grpc"]) as envoy,
            ):
                url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"
                result = summary(pool, await drive([url], arrivals), len(arrivals))
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(epp.metrics_url) as response,
                ):
                    page = await response.text()
                return {**result, **token_producer_seconds(page)}


def token_producer_seconds(page: str) -> dict[str, float]:
    """The token producer's mean duration and its calls, from the EPP's
    plugin-duration histogram (none when it does not run)."""
    total = count = 0.0
    for family in text_string_to_metric_families(page):
        if family.name != "llm_d_epp_plugin_duration_seconds":
            continue
        for sample in family.samples:
            if sample.labels.get("plugin_type") != "token-producer":
                continue
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return {"token_producer_mean_s": total / count, "tokenized": count} if count else {}


async def main_async(
    seconds: float, rate: float, seed: int, local: bool
) -> dict[str, dict[str, Any]]:
    arrivals = workload(seconds, rate, seed)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = train(Path(folder), [text for _, text in arrivals]) if local else None
        return {
            policy: await run(policy, arrivals, tokenizer)
            for policy in ("precise", "approximate", "round-robin")
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--tokenizer", choices=("local", "render"), default="local")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    results = asyncio.run(
        main_async(options.seconds, options.rate, options.seed, options.tokenizer == "local")
    )
    if options.json:
        print(json.dumps(results, indent=2))
        return
    for policy, result in results.items():
        p50, p90 = result["ttft_p50_s"] * 1e3, result["ttft_p90_s"] * 1e3
        print(
            f"{policy:12s} hit {result['hit_rate']:.1%}  TTFT p50 {p50:.0f} ms  p90 {p90:.0f} ms"
            f"  ({result['completed']}/{result['requests']}; per server {result['per_server']})"
            + (
                f"; token producer {result['token_producer_mean_s'] * 1e3:.1f} ms a request"
                if "token_producer_mean_s" in result
                else ""
            )
        )


if __name__ == "__main__":
    main()
