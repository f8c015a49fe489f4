"""GET one endpoint's metrics page over a kept-alive HTTP/1.1 connection.

The scraper reads every endpoint's page every 50 ms by default, so the
client's cost per read is most of what metrics cost the EPP; a general
client session (cookies, connection pool, tracing, per-request objects)
costs more than the read it serves. `PageFetcher` is one endpoint's: its
request is built once, it holds one connection (TLS when the scheme is
https), sends one GET at a time and parses the response with httptools
(llhttp, the C parser under uvicorn). The page is asked for uncompressed:
decompressing costs the EPP more CPU than the bytes cost the network.

What a response may be: status 200 (a same-origin redirect is followed, at
most `MAX_REDIRECTS` in a row), any content type but JSON (trtllm-serve's
`/metrics`), at most `limit` bytes, UTF-8. Anything else is a `ScrapeError`
with a short reason (the scraper's failure labels), and the connection is
closed, so a late or partial answer cannot be taken for the next one's. A
kept-alive connection the server closed while idle is opened again, once,
before a read fails.
"""

from __future__ import annotations

import asyncio
import ssl
from urllib.parse import urlsplit

import httptools

MAX_REDIRECTS = 3


class ScrapeError(Exception):
    """A metrics page could not be read; `reason` is a short label for metrics."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Response:
    __slots__ = ("body", "content_type", "location", "status")

    def __init__(self, status: int, content_type: bytes, location: bytes, body: bytes) -> None:
        self.status = status
        self.content_type = content_type
        self.location = location
        self.body = body


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection, one request at a time; httptools calls the
    `on_*` methods from `feed_data`."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[_Response] | None = None
        self._error: ScrapeError | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._content_type = b""
        self._location = b""
        self._until_close = True
        """No Content-Length nor chunked coding: the body ends with the connection."""
        self._headers_done = False
        self.closed = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self._fail(ScrapeError("unasked-for data from the server", "connection"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            pass  # a callback set `_error`
        except httptools.HttpParserError as error:
            self._error = ScrapeError(f"malformed HTTP response: {error}", "connection")
        if self._error is not None:
            self._fail(self._error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._headers_done and self._until_close and self._error is None:
            self.on_message_complete()
        else:
            self._fail(ScrapeError("the server closed the connection", "connection"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self._content_type = value.split(b";", 1)[0].strip().lower()
        elif name == b"location":
            self._location = value
        elif name == b"content-length":
            self._until_close = False
            if value.isdigit() and int(value) > self._limit:
                self._error = ScrapeError(f"page over {self._limit} bytes", "too-large")
                raise self._error
        elif name == b"transfer-encoding":
            self._until_close = False

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._limit:
            self._error = ScrapeError(f"page over {self._limit} bytes", "too-large")
            raise self._error
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        response = _Response(
            self._parser.get_status_code(),
            self._content_type,
            self._location,
            b"".join(self._chunks),
        )
        keep = not self.closed and self._parser.should_keep_alive()
        self._reset()
        if not keep:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    # -- used by PageFetcher

    async def request(self, data: bytes) -> _Response:
        if self.closed or self._transport is None:
            raise ScrapeError("the server closed the connection", "connection")
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return await self._waiter

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _reset(self) -> None:
        self._chunks = []
        self._size = 0
        self._content_type = self._location = b""
        self._until_close = True
        self._headers_done = False

    def _fail(self, error: ScrapeError) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


class PageFetcher:
    """One endpoint's page at `url` (http or https), over one connection at
    a time; see the module docstring. `close()` when done."""

    def __init__(self, url: str, ssl_context: ssl.SSLContext | bool, limit: int) -> None:
        self.url = url
        self._ssl = ssl_context if ssl_context is not False else None
        self._limit = limit
        self._connection: _Connection | None = None
        self.connections = 0
        """Connections opened so far."""
        parts = urlsplit(url)
        self._origin = (parts.scheme, parts.hostname, parts.port)
        self._request = self._request_for(parts.path or "/")

    def _request_for(self, path: str) -> bytes:
        host = self.url.split("://", 1)[1].split("/", 1)[0]
        return (
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: epp\r\n"
            "Accept: text/plain, */*\r\nAccept-Encoding: identity\r\n\r\n"
        ).encode("latin-1")

    async def get(self) -> str:
        """The page, decoded; ScrapeError or OSError when it cannot be read."""
        request = self._request
        for _ in range(MAX_REDIRECTS + 1):
            response = await self._exchange(request)
            if response.status not in (301, 302, 303, 307, 308) or not response.location:
                break
            request = self._redirected(response.location.decode("latin-1"))
        else:
            raise ScrapeError(f"more than {MAX_REDIRECTS} redirects from {self.url}", "http-status")
        if response.status != 200:
            raise ScrapeError(f"HTTP {response.status} from {self.url}", "http-status")
        if response.content_type == b"application/json":
            raise ScrapeError(
                f"{self.url} answers JSON, not Prometheus text (trtllm-serve serves its "
                "Prometheus text at /prometheus/metrics)",
                "not-prometheus-text",
            )
        try:
            return response.body.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ScrapeError(
                f"metrics page of {self.url} is not UTF-8: {error}", "not-prometheus-text"
            ) from None

    def _redirected(self, location: str) -> bytes:
        parts = urlsplit(location)
        if parts.scheme and (parts.scheme, parts.hostname, parts.port) != self._origin:
            raise ScrapeError(
                f"{self.url} redirects to another origin, {location}: not followed",
                "http-status",
            )
        path = parts.path or "/"
        return self._request_for(f"{path}?{parts.query}" if parts.query else path)

    async def _exchange(self, request: bytes) -> _Response:
        """One request and its response; a kept-alive connection that turns
        out closed is replaced once. Any failure closes the connection."""
        for attempt in (1, 2):
            connection = self._connection
            reused = connection is not None and not connection.closed
            if not reused:
                connection = self._connection = await self._connect()
            try:
                return await connection.request(request)
            except ScrapeError as error:
                connection.close()
                if not (reused and attempt == 1 and error.reason == "connection"):
                    raise
            except BaseException:
                connection.close()
                raise
        raise AssertionError("unreachable")

    async def _connect(self) -> _Connection:
        _, host, port = self._origin
        scheme = self._origin[0]
        port = port or (443 if scheme == "https" else 80)
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            lambda: _Connection(self._limit), host, port, ssl=self._ssl
        )
        self.connections += 1
        return connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
