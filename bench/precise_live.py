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

Conversations and restarts (`precise-chat-restarts.yaml` live): with
`--turns N` each arrival starts a conversation of N turns, each turn's
prompt the previous one's, a stand-in reply and a new tail, sent THINK_S
after the previous turn's answer; `--restart-every S` restarts one server
in place every S seconds, in turn (its cache lost, published as
AllBlocksCleared); `--kv-blocks` sizes the servers' caches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
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
POLICIES = ("precise", "approximate", "round-robin")
THINK_S = 3.0
REPLY_TOKENS = 20


def servers(
    events_port: int, tokenizer: Path | None, kv_blocks: int
) -> contextlib.AbstractAsyncContextManager[list[SimulatedServer]]:
    publishing = KVEventsPublishing(events_port, None)
    tokenize = encoder(tokenizer) if tokenizer is not None else None
    params = dataclasses.replace(PARAMS, kv_blocks=kv_blocks)
    pool = [SimulatedServer(params, MODEL, kv_events=publishing, tokenizer=tokenize) for _ in HOSTS]
    return serving_on(pool, HOSTS)


def workload(
    seconds: float, rate: float, seed: int, turns: int = 1
) -> list[tuple[float, list[str]]]:
    """Each arrival's time and its turns' prompts."""
    rng = random.Random(seed)
    prefixes = [f"<system prompt {g:02d}|" * (PREFIX_TOKENS * 4 // 19 + 1) for g in range(GROUPS)]
    prefixes = [p[: PREFIX_TOKENS * 4] for p in prefixes]

    def text(tokens: int) -> str:
        return "".join(rng.choice("abcdefghijklmnop ") for _ in range(tokens * 4))

    arrivals, at = [], rng.expovariate(rate)
    while at < seconds:
        tail = rng.randint(*TAIL_TOKENS)  # drawn first: the one-turn load as it always was
        prompts = [prefixes[rng.randrange(GROUPS)] + text(tail)]
        for _ in range(turns - 1):
            reply, tail = text(REPLY_TOKENS), text(rng.randint(*TAIL_TOKENS))
            prompts.append(f"{prompts[-1]} <reply> {reply} <user> {tail}")
        arrivals.append((at, prompts))
        at += rng.expovariate(rate)
    return arrivals


async def drive(urls: list[str], arrivals: list[tuple[float, list[str]]]) -> list[float]:
    """Start each conversation at its time (its turns in order, THINK_S
    apart; requests round-robin over `urls`); each request's TTFT."""
    ttfts: list[float] = []
    sent = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(text: str) -> None:
            nonlocal sent
            url = urls[sent % len(urls)]
            sent += 1
            body = {"model": MODEL, "prompt": text, "max_tokens": REPLY_TOKENS, "stream": True}
            started = time.perf_counter()
            first = None
            try:
                async with session.post(url, json=body) as response:
                    async for _ in response.content.iter_any():
                        if first is None:
                            first = time.perf_counter() - started
                    ok = response.status == 200
            except aiohttp.ClientError:  # its server restarted under it: not completed
                return
            if ok and first is not None:
                ttfts.append(first)

        async def conversation(prompts: list[str]) -> None:
            for turn, text in enumerate(prompts):
                if turn:
                    await asyncio.sleep(THINK_S)
                await one(text)

        start = time.perf_counter()
        tasks = []
        for at, prompts in arrivals:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(conversation(prompts)))
        await asyncio.gather(*tasks)
    return ttfts


async def restarting(pool: list[SimulatedServer], every: float) -> None:
    """Restart one server in place every `every` seconds, in turn."""
    for turn in range(1, 1 << 30):
        await asyncio.sleep(every)
        pool[turn % len(pool)].restart()


@contextlib.asynccontextmanager
async def restarts(pool: list[SimulatedServer], every: float | None):
    task = asyncio.create_task(restarting(pool, every)) if every else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


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
    policy: str,
    arrivals: list[tuple[float, list[str]]],
    tokenizer: Path | None,
    kv_blocks: int = PARAMS.kv_blocks,
    restart_every: float | None = None,
) -> dict[str, Any]:
    events_port = port_free_on_every(HOSTS)
    sent = sum(len(prompts) for _, prompts in arrivals)
    async with servers(events_port, tokenizer, kv_blocks) as pool:
        addresses = [f"{host}:{server.port}" for host, server in zip(HOSTS, pool, strict=True)]
        if policy == "round-robin":
            urls = [f"http://{address}/v1/completions" for address in addresses]
            async with restarts(pool, restart_every):
                ttfts = await drive(urls, arrivals)
            return summary(pool, ttfts, sent)
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
                async with restarts(pool, restart_every):
                    ttfts = await drive([url], arrivals)
                result = summary(pool, ttfts, sent)
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
    seconds: float,
    rate: float,
    seed: int,
    local: bool,
    turns: int = 1,
    kv_blocks: int = PARAMS.kv_blocks,
    restart_every: float | None = None,
    policies: tuple[str, ...] = POLICIES,
) -> dict[str, dict[str, Any]]:
    arrivals = workload(seconds, rate, seed, turns)
    with tempfile.TemporaryDirectory() as folder:
        corpus = [prompts[-1] for _, prompts in arrivals]
        tokenizer = train(Path(folder), corpus) if local else None
        return {
            policy: await run(policy, arrivals, tokenizer, kv_blocks, restart_every)
            for policy in policies
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--tokenizer", choices=("local", "render"), default="local")
    parser.add_argument("--turns", type=int, default=1, help="turns per conversation")
    parser.add_argument("--kv-blocks", type=int, default=PARAMS.kv_blocks)
    parser.add_argument("--restart-every", type=float, default=None, metavar="S")
    parser.add_argument("--policies", default=",".join(POLICIES), help="of " + ", ".join(POLICIES))
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    results = asyncio.run(
        main_async(
            options.seconds,
            options.rate,
            options.seed,
            options.tokenizer == "local",
            options.turns,
            options.kv_blocks,
            options.restart_every,
            tuple(options.policies.split(",")),
        )
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
