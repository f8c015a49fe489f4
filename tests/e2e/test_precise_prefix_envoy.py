"""The reference's precise prefix-cache samples served through a real Envoy:
three simulated vLLM servers on their own loopback addresses publish their
KV-cache events over ZMQ as vLLM does (on a port of their own that the EPP
subscribes to, `podDiscoveryConfig.socketPort`, or connected to the EPP's
bound `kvEventsConfig.zmqEndpoint`), the EPP tokenizes each prompt through
a server's render endpoint (or in process, with the servers' own
`tokenizer.json`), and a request goes to the server that holds its prefix.
Each prefix is stored on its server by a request sent to that server
directly, past the EPP, so only the server's events can tell the EPP where
it is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml
import zmq
from prometheus_client.parser import text_string_to_metric_families

from epp.demo import tokenizer_file
from epp.demo.kv_publisher import KVEventsPublishing, port_free_on_every
from epp.demo.model_server import SimulatedServer
from epp.demo.model_servers import serving_on
from epp.demo.server_formats import token_ids
from epp.demo.tokenizer_file import encoder
from epp.serve.metrics.vocabulary import P
from epp.sim.server_model import ServerParams
from tests.support.dashboards import read_page, reference_queries, unmet
from tests.support.envoy import running_envoy
from tests.support.epp_process import running_epp

pytestmark = [pytest.mark.envoy, pytest.mark.asyncio(loop_scope="module")]

SAMPLES_DIR = Path(__file__).parents[1] / "data" / "reference_configs"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
MODEL = "hf-repo/model-name"


@dataclass(slots=True, frozen=True)
class Sample:
    """A sample and what its servers run with: its block size and hash seed,
    whether they connect to the EPP's bound endpoint, and whether they and the
    EPP's token producer (its local backend) load one trained tokenizer.json."""

    file: str
    block: int
    seed: str = ""
    bound: bool = False
    local: bool = False

    def name(self) -> str:
        return self.file + (" (local tokenizer)" if self.local else "")


SAMPLES = (
    Sample("epp-precise-prefix-cache-config.yaml", 64),
    Sample("sim-epp-kvcache-config.yaml", 16, bound=True),
    Sample("sim-epp-tokenizer-vllm-http-config.yaml", 16, "42", bound=True),
    Sample("sim-epp-kvcache-config.yaml", 16, bound=True, local=True),
)


def sample_config(folder: Path, sample: Sample, render_url: str, events: str, replay: int) -> Path:
    """The sample as written, with what a deployment fills in: the model, the
    render service's URL (or the model directory) and where the KV-cache
    events come from."""
    config = yaml.safe_load((SAMPLES_DIR / sample.file).read_text())
    for plugin in config["plugins"]:
        parameters = plugin.get("parameters") or {}
        if plugin["type"] == "token-producer":
            parameters["modelName"] = MODEL
            if sample.local:
                del parameters["vllm"]
                parameters["local"] = {"modelDir": str(folder)}
            else:
                parameters["vllm"]["url"] = render_url
        if plugin["type"] == "precise-prefix-cache-producer":
            if sample.bound:
                parameters["kvEventsConfig"]["zmqEndpoint"] = events
            else:
                port = int(events.rsplit(":", 1)[1])
                parameters["kvEventsConfig"] = {
                    "podDiscoveryConfig": {"socketPort": port, "replaySocketPort": replay}
                }
    path = folder / "precise.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def servers(
    sample: Sample,
    events: str,
    replay: int,
    replays: int = len(HOSTS),
    tokenizer: Callable[[str], list[int]] | None = None,
) -> contextlib.AbstractAsyncContextManager[list[SimulatedServer]]:
    """A server on each of HOSTS publishing as `sample` says, tokenizing
    with `tokenizer` (None: the simulated one); only the first `replays` of
    them keep a replay socket."""
    port = int(events.rsplit(":", 1)[1])
    params = ServerParams(block_size=sample.block, kv_blocks=4000)
    publishing = [
        KVEventsPublishing(hash_seed=sample.seed, connect=events)
        if sample.bound
        else KVEventsPublishing(port, replay if index < replays else None, hash_seed=sample.seed)
        for index in range(len(HOSTS))
    ]
    return serving_on(
        [
            SimulatedServer(params, MODEL, kv_events=each, tokenizer=tokenizer)
            for each in publishing
        ],
        HOSTS,
    )


def prompt(prefix: str, turn: int) -> str:
    return f"{prefix} " * 160 + f" question {turn}"


async def series(session: aiohttp.ClientSession, url: str, name: str) -> dict:
    """The samples of `name` on the page at `url`: labels -> value."""
    async with session.get(url) as reply:
        text = await reply.text()
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


async def complete(session: aiohttp.ClientSession, url: str, text: str) -> dict:
    body = {"model": MODEL, "prompt": text, "max_tokens": 2}
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


@contextlib.asynccontextmanager
async def publishing_servers(
    sample: Sample,
    replays: int,
    tokenizer: Callable[[str], list[int]] | None = None,
    attempts: int = 5,
) -> AsyncIterator[tuple[list[SimulatedServer], str, int]]:
    """`servers` on an events port and a replay port free on every host, with
    the endpoint and replay port; new ports when another process binds a probed
    one before the servers do (the probe cannot hold it)."""
    async with contextlib.AsyncExitStack() as exits:
        for attempt in range(attempts):
            events = f"tcp://{HOSTS[0]}:{port_free_on_every(HOSTS)}"
            replay = port_free_on_every(HOSTS)
            try:
                pool = await exits.enter_async_context(
                    servers(sample, events, replay, replays, tokenizer)
                )
            except zmq.ZMQError as error:
                if error.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                    raise
                continue
            yield pool, events, replay
            return


RECEIVED = "llm_d_epp_kv_cache_events_messages_received_total"


async def until_subscribed(
    session: aiohttp.ClientSession, metrics_url: str, address: str, attempts: int = 40
) -> None:
    """Once the EPP has received a message from the server at `address`: a
    subscription takes effect some time after the connection, and what the
    server publishes before it is dropped, so a request of its own (a new
    prompt each try) is sent to the server until one's events arrive."""
    for attempt in range(attempts):
        await complete(session, f"http://{address}/v1/completions", prompt(f"warm{attempt}", 0))
        for _ in range(10):
            received = await series(session, metrics_url, RECEIVED)
            if any(dict(labels).get("pod_identifier") == address for labels in received):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"no KV-cache events from {address} reached the EPP")


@contextlib.asynccontextmanager
async def stack(tmp_path: Path, sample: Sample, replays: int = len(HOSTS)):
    """The servers, the EPP serving `sample` and Envoy; each prefix of HOMES
    stored on its server directly, and the EPP's index holding them."""
    tokenize = token_ids
    if sample.local:
        corpus = [prompt(prefix, turn) for prefix in HOMES for turn in range(4)]
        tokenize = encoder(tokenizer_file.train(tmp_path, corpus))
    servers_tokenizer = tokenize if sample.local else None
    async with publishing_servers(sample, replays, servers_tokenizer) as (pool, events, replay):
        addresses = [f"{host}:{server.port}" for host, server in zip(HOSTS, pool, strict=True)]
        config = sample_config(tmp_path, sample, f"http://{addresses[0]}", events, replay)
        async with (
            running_epp(f"--config-file={config}", f"--endpoints={','.join(addresses)}") as epp,
            running_envoy(epp_port=epp.ports["grpc"]) as envoy,
            aiohttp.ClientSession() as session,
        ):
            for server in pool:  # a PUB drops what it sends before it is connected
                assert server.publisher is not None
                await asyncio.wait_for(server.publisher.connected.wait(), 10)
            for address in addresses:
                await until_subscribed(session, epp.metrics_url, address)
            name = "llm_d_epp_kv_cache_index_blocks"
            held = (await series(session, epp.metrics_url, name)).get((), 0)
            for prefix, home in HOMES.items():
                direct = f"http://{addresses[home]}/v1/completions"
                await complete(session, direct, prompt(prefix, 0))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            blocks = held + sum(len(tokenize(prompt(p, 0))) // sample.block for p in HOMES)
            while (await series(session, epp.metrics_url, name)).get((), 0) < blocks:
                assert loop.time() < deadline, f"the index never held {blocks} blocks:\n{epp.log()}"
                await asyncio.sleep(0.05)
            yield (
                pool,
                addresses,
                epp,
                f"http://127.0.0.1:{envoy.listen_port}/v1/completions",
                session,
            )


HOMES = {"alpha": 1, "beta": 2}
"""Each prefix and the server it is stored on."""


async def served_over_three_turns(pool, session, gateway) -> list[int]:
    """Three turns of each prefix's conversation through the gateway; how
    many requests each server admitted."""
    before = [server.model.admitted_total for server in pool]
    for turn in range(1, 4):
        for prefix in HOMES:
            await complete(session, gateway, prompt(prefix, turn))
    return [server.model.admitted_total - n for server, n in zip(pool, before, strict=True)]


@pytest.mark.parametrize("sample", SAMPLES, ids=Sample.name)
async def test_requests_sharing_a_prefix_go_to_the_server_whose_events_hold_it(tmp_path, sample):
    async with stack(tmp_path, sample) as (pool, addresses, epp, gateway, session):
        served = await served_over_three_turns(pool, session, gateway)
        assert served == [0, 3, 3], served
        received = await series(session, epp.metrics_url, RECEIVED)
        assert {dict(labels)["pod_identifier"] for labels in received} >= set(addresses[1:])
        # Every request went through the token producer (with --workers, its workers').
        tokenized = await series(session, epp.metrics_url, P + "token_producer_tokenized_total")
        fallbacks = await series(session, epp.metrics_url, P + "token_producer_fallbacks_total")
        assert sum(tokenized.values()) > 0
        assert sum(tokenized.values()) + sum(fallbacks.values()) == sum(served)
        # What its bounded caches hold (the workers' summed): the digests of the
        # prompts' blocks, and with the local backend the prefix store's blocks.
        held = await series(session, epp.metrics_url, P + "token_producer_cache_entries")
        held = {dict(labels)["cache"]: value for labels, value in held.items()}
        assert held["digest-memo"] > 0
        assert (held.get("prefix-store", 0) > 0) is sample.local, held


KV_CACHE_ALERTS = "llm-d_guides_epp_panels.yaml"
NO_WORKER_POOL = "KVCacheEventsPoolBacklog"
"""The one KV-cache alert that reads a series epp does not emit: the depth of
the reference's event worker pool; epp applies each message as it reads it."""


async def test_the_kv_cache_alert_rules_read_series_the_epp_emits(tmp_path):
    # The last server has no replay socket (a replay error); one server
    # restarts on its address (a reconnection).
    sample = SAMPLES[0]
    async with stack(tmp_path, sample, replays=2) as (pool, _, epp, gateway, session):
        old = pool[1]
        await old.stop()
        pool[1] = SimulatedServer(old.params, MODEL, kv_events=old.kv_events)
        await pool[1].start(HOSTS[1], old.port)
        for turn in range(1, 3):
            for prefix in HOMES:
                await complete(session, gateway, prompt(prefix, turn))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        name = "llm_d_epp_kv_cache_events_subscriber_reconnections_total"
        while not await series(session, epp.metrics_url, name):
            assert loop.time() < deadline, "the subscriber never saw its publisher come back"
            await asyncio.sleep(0.05)
        async with session.get(epp.metrics_url) as reply:
            page = read_page(await reply.text())
    failures, checked = {}, set()
    for query in reference_queries():
        alert = (query.source, query.panel)
        if query.source != KV_CACHE_ALERTS or not query.panel.startswith("KVCache"):
            continue
        if query.panel == NO_WORKER_POOL:
            continue
        for selector in query.epp_selectors():
            checked.add(alert)
            missing = unmet(selector, page)
            if missing:
                failures.setdefault(query.panel, set()).update(missing)
    assert not failures, failures
    assert len(checked) == 9


async def test_the_no_hit_lru_sample_serves_through_envoy_spreading_what_nothing_matches(
    tmp_path,
):
    # The sample names no token-producer, so no request carries the servers'
    # tokens: the precise index, fed by the events, matches nothing (epp
    # warns at load) and the no-hit-lru scorer spreads the requests.
    sample = Sample("sim-epp-no-hit-lru.yaml", 5)
    async with stack(tmp_path, sample) as (pool, _, _, gateway, session):
        served = await served_over_three_turns(pool, session, gateway)
        assert served == [2, 2, 2], served


async def test_after_a_server_restarts_in_place_its_sessions_go_back_to_it(tmp_path):
    # The restarted server holds nothing; another holds the first part of
    # alpha's prompt: the next turn still goes back to the server that held
    # all of it before the restart (the index's former blocks).
    sample = SAMPLES[1]
    async with stack(tmp_path, sample) as (pool, addresses, epp, gateway, session):

        async def received_from_first() -> float:
            received = await series(session, epp.metrics_url, RECEIVED)
            return sum(v for k, v in received.items() if dict(k)["pod_identifier"] == addresses[0])

        seen = await received_from_first()
        await complete(session, f"http://{addresses[0]}/v1/completions", "alpha " * 64)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while await received_from_first() <= seen:
            assert loop.time() < deadline, "the first part's events never reached the index"
            await asyncio.sleep(0.05)
        pool[HOMES["alpha"]].restart()
        former = "llm_d_epp_kv_cache_index_former_blocks"
        while not (await series(session, epp.metrics_url, former)).get((), 0):
            assert loop.time() < deadline + 10, "the restart never reached the index"
            await asyncio.sleep(0.05)
        before = [server.model.admitted_total for server in pool]
        await complete(session, gateway, prompt("alpha", 1))
        served = [server.model.admitted_total - n for server, n in zip(pool, before, strict=True)]
        assert served == [0, 1, 0], served
