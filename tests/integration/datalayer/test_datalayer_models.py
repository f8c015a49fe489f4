"""Every endpoint's model list for `models-responder`, read from real HTTP
`/v1/models` servers on 127.0.0.1."""

import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from epp.datalayer.endpoints import EndpointSpec
from epp.datalayer.models import ModelLists, ModelsPageError, ModelsScraper, read_model_list
from epp.datalayer.store import EndpointStore
from tests.support.http_server import http_server
from tests.support.waiting import eventually


def page(*ids: str, **extra) -> dict:
    return {"object": "list", "data": [{"id": i, "object": "model", **extra} for i in ids]}


@contextlib.asynccontextmanager
async def models_server(document: dict | None, status: int = 200) -> AsyncIterator[TestServer]:
    async def handle(_: web.Request) -> web.Response:
        return web.json_response(document, status=status)

    async with http_server({"/v1/models": handle}) as server:
        yield server


def spec(server: TestServer, name: str) -> EndpointSpec:
    return EndpointSpec(name, f"127.0.0.1:{server.port}")


def answer(lists: ModelLists) -> dict | None:
    body = lists.answer()
    return None if body is None else json.loads(body)


def test_a_model_list_keeps_the_fields_the_reference_returns():
    body = json.dumps(
        {"data": [{"id": "m", "object": "model", "created": 1, "owned_by": "vllm", "root": "x"}]}
    ).encode()
    assert read_model_list(body) == (
        {"id": "m", "object": "model", "created": 1, "owned_by": "vllm"},
    )


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"data": [{"object": "model"}]}'])
def test_a_page_that_is_no_model_list_is_refused(body):
    with pytest.raises(ModelsPageError):
        read_model_list(body)


def test_no_answer_while_no_endpoint_has_reported_its_list():
    store = EndpointStore([EndpointSpec("a", "10.0.0.1:8000")])
    assert ModelLists(store).answer() is None


def test_the_answer_is_the_union_sorted_by_id_with_the_first_endpoints_copy_of_a_duplicate():
    store = EndpointStore([EndpointSpec("b", "10.0.0.2:8000"), EndpointSpec("a", "10.0.0.1:8000")])
    lists = ModelLists(store)
    lists.set("10.0.0.2:8000", ({"id": "base", "owned_by": "b"}, {"id": "lora-z"}))
    lists.set("10.0.0.1:8000", ({"id": "base", "owned_by": "a"}, {"id": "lora-a"}))
    assert answer(lists) == {
        "object": "list",
        "data": [{"id": "base", "owned_by": "a"}, {"id": "lora-a"}, {"id": "lora-z"}],
    }


def test_an_endpoint_that_left_the_pool_no_longer_counts():
    store = EndpointStore([EndpointSpec("a", "10.0.0.1:8000"), EndpointSpec("b", "10.0.0.2:8000")])
    lists = ModelLists(store)
    lists.set("10.0.0.1:8000", ({"id": "only-a"},))
    lists.set("10.0.0.2:8000", ({"id": "only-b"},))
    store.remove("10.0.0.1:8000")
    assert [model["id"] for model in answer(lists)["data"]] == ["only-b"]


async def test_each_endpoints_list_is_read_from_its_server():
    async with models_server(page("base", "lora-1")) as one, models_server(page("base")) as two:
        store = EndpointStore([spec(one, "one"), spec(two, "two")])
        lists = ModelLists(store)
        async with ModelsScraper(store, lists, interval=0.02, timeout=0.5):
            await eventually(lambda: lists.answer() is not None and len(answer(lists)["data"]) == 2)
    assert [model["id"] for model in answer(lists)["data"]] == ["base", "lora-1"]


async def test_a_server_that_fails_its_list_does_not_count():
    async with models_server(None, status=500) as failing:
        store = EndpointStore([spec(failing, "failing")])
        lists = ModelLists(store)
        async with ModelsScraper(store, lists, interval=0.02, timeout=0.5) as scraper:
            await eventually(lambda: scraper.failures >= 2)
        assert lists.answer() is None
