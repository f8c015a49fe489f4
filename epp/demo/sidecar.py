"""The routing sidecar in front of a decode server, as llm-d's P/D sidecar.

The pool's endpoint for a decode pod is its sidecar. A request that comes
with `x-prefiller-host-port` (the EPP's choice of prefill endpoint; a comma
list is read as the reference reads it, first entry) is run in two legs:

1. prefill: the same path and body to the prefill server, with `max_tokens`
   (and `max_completion_tokens`, when given) 1, `stream` false, no
   `stream_options`, and `kv_transfer_params` asking for a remote decode
   (`do_remote_decode: true`, as vLLM's NixlConnector protocol);
2. decode: the original body, with the `kv_transfer_params` the prefill
   server returned, to the decode server; its response (streamed or not)
   is the client's.

When the prefill leg fails (no connection, or an HTTP error after
`prefill_retries` retries of 502/503/504), the sidecar decodes with a local
prefill: the original body to the decode server, so the request still gets
an answer (the reference's sidecar answers the prefill's error instead).
A request without the header, and every other path (`/metrics`, `/health`,
`/v1/models`), goes to the decode server unchanged, so the EPP scrapes the
decode server through its sidecar as it would in a pod.

    epp sidecar [--port 8000] [--model-server-port 8200]

runs one sidecar as the reference's runs in a decode pod: on `--port`, in
front of the decode server at localhost:`--model-server-port` (the
reference's flags and defaults; `--vllm-port` is its deprecated name).

    epp sidecar --decoders 127.0.0.1:8200,... --ready-file F

runs one sidecar per decode server on free ports, in one process (the
demo's way; `python -m epp.demo.sidecar` is the same command). With
`--ready-file`, once listening it writes `{"ports": [...], "pid": N}` (in
the decoders' order); SIGTERM or SIGINT stops them. `--prefill-timeout`
bounds a prefill leg (then the decode server prefills locally), 60 s as the
EPP's `flowControl.gate.prefillTimeout`. Counters: `remote_prefills` (legs
that succeeded), `fallbacks`, `local` (requests without the header), in
`Sidecar.stats`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from epp.api.units import parse_duration
from epp.cli import given
from epp.demo.processes import serve_until_signalled

PREFILLER_HEADER = "x-prefiller-host-port"
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
RETRYABLE = frozenset({502, 503, 504})
MAX_BODY = 64 * 1024 * 1024


@dataclass(slots=True)
class SidecarStats:
    remote_prefills: int = 0
    fallbacks: int = 0
    local: int = 0


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: one token, not streamed, KV kept for a remote decode."""
    leg = dict(body)
    leg["max_tokens"] = 1
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    leg.pop("stream_options", None)
    leg["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return leg


def first_prefiller(value: str) -> str:
    return value.split(",")[0].strip()


def _forward_headers(headers: Any) -> dict[str, str]:
    return {
        key: value
        for key, value in headers.items()
        if key.lower() not in HOP_BY_HOP and key.lower() != PREFILLER_HEADER
    }


@dataclass(slots=True, eq=False)
class Sidecar:
    """One sidecar in front of the decode server at `decoder` (host:port)."""

    decoder: str
    prefill_retries: int = 1
    prefill_timeout_s: float = 60.0
    host: str = "127.0.0.1"
    listen_port: int = 0
    """Where `start` listens; 0: a free port."""
    stats: SidecarStats = field(default_factory=SidecarStats, init=False)
    port: int = field(default=0, init=False)
    """The bound port, once started."""
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)

    async def start(self) -> int:
        """Listen on the host and port it was given (port 0: a free one); the bound port."""
        host, port = self.host, self.listen_port
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        prefiller = request.headers.get(PREFILLER_HEADER, "")
        if request.method != "POST" or request.path not in GENERATE_PATHS or not prefiller:
            if request.method == "POST" and request.path in GENERATE_PATHS:
                self.stats.local += 1
            return await self._proxy(request, body)
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            parsed = None
        if not isinstance(parsed, dict):
            return await self._proxy(request, body)  # the decode server answers 400
        kv = await self._prefill(request, first_prefiller(prefiller), parsed)
        if kv is None:
            self.stats.fallbacks += 1
            return await self._proxy(request, body)
        self.stats.remote_prefills += 1
        parsed["kv_transfer_params"] = kv
        return await self._proxy(request, json.dumps(parsed).encode())

    async def _prefill(
        self, request: web.Request, prefiller: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The prefill leg; the KV parameters to decode with, or None when it failed."""
        assert self._session is not None
        data = json.dumps(prefill_body(body)).encode()
        headers = _forward_headers(request.headers)
        headers["Content-Type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=self.prefill_timeout_s)
        for _ in range(self.prefill_retries + 1):
            try:
                async with self._session.post(
                    f"http://{prefiller}{request.path}", data=data, headers=headers, timeout=timeout
                ) as response:
                    if response.status in RETRYABLE:
                        continue
                    if response.status >= 400:
                        return None
                    answer = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                return None
            kv = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            params = dict(kv) if isinstance(kv, dict) else {}
            params["do_remote_prefill"] = True
            params["do_remote_decode"] = False
            return params
        return None

    async def _proxy(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """`request` (with `body`) to the decode server; its answer streamed back."""
        assert self._session is not None
        url = f"http://{self.decoder}{request.rel_url}"
        try:
            async with self._session.request(
                request.method, url, data=body, headers=_forward_headers(request.headers)
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status, headers=_forward_headers(upstream.headers)
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as error:
            return web.json_response(
                {"error": {"message": f"decode server: {error}", "code": 502}}, status=502
            )


DEFAULT_PORT = 8000
DEFAULT_MODEL_SERVER_PORT = 8200
"""The reference sidecar's defaults: it listens on 8000 in front of the
decode server on localhost:8200."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port the sidecar listens on (default {DEFAULT_PORT}; 0: a free port)",
    )
    parser.add_argument(
        "--model-server-port",
        type=int,
        default=None,
        help=f"the decode server's port on localhost (default {DEFAULT_MODEL_SERVER_PORT})",
    )
    parser.add_argument(
        "--vllm-port", type=int, default=None, help="deprecated: use --model-server-port"
    )
    parser.add_argument(
        "--decoders",
        default=None,
        help="host:port,... of several decode servers: one sidecar each on a free port "
        "(instead of --port and --model-server-port)",
    )
    parser.add_argument(
        "--bind-address", default="0.0.0.0", help="the address the sidecars listen on"
    )
    parser.add_argument(
        "--ready-file",
        default=None,
        help='once listening, write {"ports": [...], "pid": N} there',
    )
    parser.add_argument(
        "--prefill-retries", type=int, default=1, help="retries of a 502/503/504 prefill"
    )
    parser.add_argument(
        "--prefill-timeout",
        default="60s",
        help="the longest a prefill leg may take before the decode server prefills locally "
        "(a Go duration, as the EPP's flowControl.gate.prefillTimeout; default 60s)",
    )


def sidecars_of(args: argparse.Namespace) -> list[Sidecar]:
    """The sidecars the arguments ask for; ValueError naming the flag at fault."""
    try:
        timeout = parse_duration(args.prefill_timeout)
    except ValueError as error:
        raise ValueError(f"--prefill-timeout: {error}") from None
    if timeout <= 0:
        raise ValueError(f"--prefill-timeout: must be positive, got {args.prefill_timeout!r}")
    if args.prefill_retries < 0:
        raise ValueError(f"--prefill-retries: must not be negative, got {args.prefill_retries}")
    host = args.bind_address
    if args.decoders is not None:
        if args.model_server_port is not None or args.vllm_port is not None:
            raise ValueError("--decoders names the decode servers: drop --model-server-port")
        decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
        if not decoders:
            raise ValueError("--decoders: none given")
        return [Sidecar(d, args.prefill_retries, timeout, host) for d in decoders]
    port = args.model_server_port or args.vllm_port or DEFAULT_MODEL_SERVER_PORT
    decoder = f"127.0.0.1:{port}"
    return [Sidecar(decoder, args.prefill_retries, timeout, host, args.port)]


async def _serve(sidecars: list[Sidecar], ready_file: str | None) -> None:
    await serve_until_signalled(sidecars, ready_file)


def run(args: argparse.Namespace) -> int:
    sidecars = given(sidecars_of, args)
    asyncio.run(_serve(sidecars, args.ready_file))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp.demo.sidecar")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
