"""PageFetcher against real HTTP servers on 127.0.0.1: aiohttp's, and raw
asyncio servers for the answers aiohttp would not give."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from epp.datalayer.fetch import PageFetcher, ScrapeError
from tests.support.http_server import http_server

PAGE = "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\n"
LIMIT = 1 << 20


@contextlib.asynccontextmanager
async def raw_server(
    answer: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[int]:
    """A server that reads each request's head and runs `answer`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await answer(reader, writer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def page(_: web.Request) -> web.Response:
    return web.Response(text=PAGE)


def fetcher(port: int, path: str = "/metrics", limit: int = LIMIT) -> PageFetcher:
    return PageFetcher(f"http://127.0.0.1:{port}{path}", False, limit)


async def failure(fetch: PageFetcher) -> str:
    with pytest.raises(ScrapeError) as error:
        await fetch.get()
    return error.value.reason


async def test_successive_reads_share_one_connection():
    async with http_server({"/metrics": page}) as server:
        fetch = fetcher(server.port)
        pages = [await fetch.get() for _ in range(5)]
        fetch.close()
    assert pages == [PAGE] * 5
    assert fetch.connections == 1


async def test_a_chunked_page_is_read_whole():
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for line in PAGE.splitlines(keepends=True):
            await response.write(line.encode())
        await response.write_eof()
        return response

    async with http_server({"/metrics": chunked}) as server:
        fetch = fetcher(server.port)
        assert [await fetch.get(), await fetch.get()] == [PAGE, PAGE]
        fetch.close()


async def test_a_page_that_ends_with_the_connection_is_read_whole():
    async def until_close(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PAGE.encode())
        await writer.drain()

    async with raw_server(until_close) as port:
        fetch = fetcher(port)
        assert [await fetch.get(), await fetch.get()] == [PAGE, PAGE]
    assert fetch.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_opened_again():
    async def one_answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        body = PAGE.encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()  # and the connection closes, unannounced

    async with raw_server(one_answer) as port:
        fetch = fetcher(port)
        assert await fetch.get() == PAGE
        await asyncio.sleep(0.05)
        assert await fetch.get() == PAGE
    assert fetch.connections == 2


async def test_a_same_origin_redirect_is_followed():
    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/metrics/")

    async with http_server({"/metrics": moved, "/metrics/": page}) as server:
        fetch = fetcher(server.port)
        assert await fetch.get() == PAGE
        fetch.close()


async def test_a_redirect_to_another_origin_fails_the_read():
    async def elsewhere(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://127.0.0.2:9/metrics")

    async with http_server({"/metrics": elsewhere}) as server:
        assert await failure(fetcher(server.port)) == "http-status"


async def test_a_page_over_the_limit_fails_by_its_length_or_its_chunks():
    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(10):
            await response.write(b"x" * 200)
        await response.write_eof()
        return response

    async with http_server({"/metrics": page, "/chunked": chunked}) as server:
        assert await failure(fetcher(server.port, limit=10)) == "too-large"
        assert await failure(fetcher(server.port, "/chunked", limit=1000)) == "too-large"


async def test_a_malformed_answer_fails_the_read_and_the_next_read_connects_again():
    answers = [b"HTTP/1.1 2xx nonsense\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]

    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.pop(0))
        await writer.drain()
        await reader.read()

    async with raw_server(answer) as port:
        fetch = fetcher(port)
        assert await failure(fetch) == "connection"
        assert await fetch.get() == "ok"
        fetch.close()
    assert fetch.connections == 2


async def test_a_read_cut_by_a_timeout_leaves_no_answer_for_the_next_read():
    delays = [0.3, 0.0]

    async def slow_then_fast(request: web.Request) -> web.Response:
        delay = delays.pop(0)
        await asyncio.sleep(delay)
        return web.Response(text=f"answer after {delay}")

    async with http_server({"/metrics": slow_then_fast}) as server:
        fetch = fetcher(server.port)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await fetch.get()
        assert await fetch.get() == "answer after 0.0"
        fetch.close()
