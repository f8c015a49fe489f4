"""The transport's cost per frame and its memory under hostile clients.

    python -m bench.transport_limits [--server epp|grpclib] [--streams 50000]
    python -m bench.transport_limits --against main [--rounds 2] [--streams 20000]

Starts a gRPC server in a subprocess (`epp`: epp.transport with its default
limits, except the control-frame rate and ping policy, which would end the
measuring connection; `grpclib`: grpclib's server, for the transport's
evaluation in epp/transport/README.md) serving an echo method and a method
that never answers (a queued request). Then, from this process, over raw
sockets:

- `cpu_us_per_frame`: the server's CPU (its threads' time on a CPU, /proc) per WINDOW_UPDATE,
  SETTINGS (no change), SETTINGS changing INITIAL_WINDOW_SIZE or
  MAX_FRAME_SIZE (each frame alternates between two values, so every one
  changes the setting) and PING frame, with no stream open and with
  `open_streams` open on the same connection: `--streams`, or fewer if the
  server advertises fewer (grpclib: h2's default of 100). Every stream is a
  call waiting for an answer; epp is told to allow that many;
- `rapid_reset`: HEADERS+RST_STREAM pairs on one connection until the
  server sends GOAWAY or 20,000 pairs: the pairs sent, the GOAWAY's error
  code, CPU per pair;
- `memory_mib`: growth of the server's resident memory under a client that
  never reads: 50,000 PINGs; unknown methods with 100 KB of long paths; a
  stream with a zero receive window echoing 1 MiB messages (up to 100; as
  many as the server accepts within 3 s).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h2.config
import h2.connection
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tests.support.raw_h2 import headers_frame, request_headers, split_frames

ECHO = "/bench.Echo/Echo"
SINK = "/bench.Echo/Sink"
MIB = 1024 * 1024
MAX_CONCURRENT_STREAMS = 3


def cpu_seconds(pid: int) -> float:
    """The process's time on a CPU, summed over its threads: the scheduler's
    nanoseconds (/proc/.../schedstat), not the 10 ms ticks of /proc/.../stat."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the servers ------------------------------------------------------------------


def serve_epp(port_file: Path, streams: int) -> None:
    import uvloop

    from epp.transport import GrpcServer, TransportLimits
    from tests.support.grpc_handlers import Echo, Sink

    async def main() -> None:
        limits = TransportLimits(
            max_concurrent_streams=max(streams + 10, 65_536),
            max_control_frames_per_second=10**9,
            max_ping_strikes=10**9,
        )
        server = GrpcServer({ECHO: Echo, SINK: Sink}, limits=limits)
        port = await server.start("127.0.0.1", 0)
        port_file.write_text(str(port))
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_grpclib(port_file: Path) -> None:
    import uvloop
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server

    class RawCodec(CodecBase):
        __content_subtype__ = "proto"

        def encode(self, message, message_type):
            return message

        def decode(self, data, message_type):
            return data

    class Service:
        async def echo(self, stream) -> None:
            async for message in stream:
                await stream.send_message(message)

        async def sink(self, stream) -> None:
            async for _ in stream:
                pass
            await asyncio.Event().wait()

        def __mapping__(self):
            return {
                ECHO: Handler(self.echo, Cardinality.STREAM_STREAM, bytes, bytes),
                SINK: Handler(self.sink, Cardinality.STREAM_STREAM, bytes, bytes),
            }

    async def main() -> None:
        server = Server([Service()], codec=RawCodec())
        await server.start("127.0.0.1", 0)
        port_file.write_text(str(server._server.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    uvloop.run(main())


# -- the client ---------------------------------------------------------------------


class Raw:
    """A client connection on a blocking socket; frames built by hand."""

    def __init__(self, port: int, receive_buffer: int | None = None) -> None:
        self.sock = socket.socket()
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.connect(("127.0.0.1", port))
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(2**30)
        self.sock.sendall(self.h2.data_to_send())
        self._raw = bytearray()
        self.frames: list[Frame] = []
        self.closed = False
        self.goaway_frame: GoAwayFrame | None = None
        self.server_settings: dict[int, int] = {}

    def headers(self, stream_id: int, path: str) -> bytes:
        headers = request_headers(path, [("te", "trailers")], authority="bench")
        return headers_frame(self.h2.encoder, stream_id, headers)

    def send(self, data: bytes, timeout: float = 30.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self._raw += data
        for frame in split_frames(self._raw):
            if isinstance(frame, GoAwayFrame):
                self.goaway_frame = frame
            elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                self.server_settings.update(frame.settings)
                self.send(SettingsFrame(0, flags=["ACK"]).serialize())
            elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
                self.send(PingFrame(0, flags=["ACK"], opaque_data=frame.opaque_data).serialize())
            if not isinstance(frame, DataFrame):
                self.frames.append(frame)

    def sync(self, token: bytes, timeout: float = 120.0) -> bool:
        """Send a PING and wait for its ACK: the server has handled all before it."""
        self.send(PingFrame(0, opaque_data=token).serialize())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed:
            for frame in self.frames:
                if (
                    isinstance(frame, PingFrame)
                    and "ACK" in frame.flags
                    and frame.opaque_data == token
                ):
                    self.frames.clear()
                    return True
            self.frames.clear()
            self.read(0.2)
        return False

    def goaway(self) -> GoAwayFrame | None:
        return self.goaway_frame


def frame_cost(client: Raw, pid: int, frames: bytes, per: int, count: int, token: bytes) -> float:
    """Server CPU per frame, in µs, over `count` frames sent as copies of
    `frames` (`per` frames each)."""
    if not client.sync(token + b"0"):
        raise RuntimeError(f"the server closed the measuring connection: {client.goaway()}")
    copies = max(count // per, 1)
    before = cpu_seconds(pid)
    for start in range(0, copies, 500):
        client.send(frames * min(500, copies - start))
        client.read(0)
    if not client.sync(token + b"1"):
        raise RuntimeError(f"the server closed the measuring connection: {client.goaway()}")
    return round((cpu_seconds(pid) - before) / (copies * per) * 1e6, 2)


INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 4, 5
FRAMES: dict[str, tuple[bytes, int, int]] = {
    "window_update": (WindowUpdateFrame(0, window_increment=1).serialize(), 1, 1),
    "settings": (SettingsFrame(0, settings={1: 4096}).serialize(), 1, 1),
    "settings_initial_window": (
        SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 65_536}).serialize()
        + SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 65_535}).serialize(),
        2,
        20,
    ),
    "settings_max_frame_size": (
        SettingsFrame(0, settings={MAX_FRAME_SIZE: 16_385}).serialize()
        + SettingsFrame(0, settings={MAX_FRAME_SIZE: 16_384}).serialize(),
        2,
        20,
    ),
    "ping": (PingFrame(0, opaque_data=b"benchpng").serialize(), 1, 1),
}
"""Name: (bytes sent, frames in them, how many times fewer are sent than
`--frames`: a frame that once cost milliseconds would take minutes)."""


def per_frame(port: int, pid: int, streams: int, count: int) -> dict:
    result: dict[str, dict[str, float]] = {}
    client = Raw(port)
    for name, (frames, per, fewer) in FRAMES.items():
        result.setdefault(name, {})["no_streams"] = frame_cost(
            client, pid, frames, per, count // fewer, b"zeroopn"
        )
    streams = min(streams, client.server_settings.get(MAX_CONCURRENT_STREAMS, streams))
    batch = bytearray()
    for stream_id in range(1, 2 * streams, 2):
        batch += client.headers(stream_id, SINK)
        if len(batch) > 256 * 1024:
            client.send(bytes(batch))
            batch.clear()
            client.read(0)
    client.send(bytes(batch))
    if not client.sync(b"opened!!", timeout=600):
        raise RuntimeError(f"the server closed the connection opening streams: {client.goaway()}")
    for name, (frames, per, fewer) in FRAMES.items():
        result[name]["open_streams"] = frame_cost(
            client, pid, frames, per, count // fewer, b"manyopn"
        )
    client.sock.close()
    return {"open_streams": streams, **result}


def rapid_reset(port: int, pid: int) -> dict:
    client = Raw(port)
    client.sync(b"rr-start")
    before = cpu_seconds(pid)
    sent = 0
    while sent < 20_000 and not client.closed and client.goaway() is None:
        batch = bytearray()
        for stream_id in range(1 + 2 * sent, 1 + 2 * (sent + 200), 2):
            batch += client.headers(stream_id, SINK)
            batch += RstStreamFrame(stream_id, error_code=8).serialize()
        if not client.send(bytes(batch), timeout=5):
            break
        sent += 200
        client.read(0.001)
    client.sync(b"rr-stop!", timeout=10)
    spent = cpu_seconds(pid) - before
    goaway = client.goaway()
    client.sock.close()
    return {
        "pairs_sent": sent,
        "goaway_error_code": None if goaway is None else goaway.error_code,
        "cpu_us_per_pair": round(spent / max(sent, 1) * 1e6, 1),
    }


def never_reading(port: int, pid: int) -> dict:
    growth: dict[str, float] = {}

    def measured(name: str, flood) -> None:
        before = rss_mib(pid)
        client = Raw(port, receive_buffer=4096)
        flood(client)
        time.sleep(1.0)
        growth[name] = round(rss_mib(pid) - before, 1)
        client.sock.close()
        time.sleep(0.5)

    def pings(client: Raw) -> None:
        client.send(PingFrame(0, opaque_data=b"flooding").serialize() * 50_000, timeout=3)

    def long_paths(client: Raw) -> None:
        batch = bytearray()
        for stream_id in range(1, 2 * 10, 2):
            batch += client.headers(stream_id, "/x/" + "p" * 10_000)
        client.send(bytes(batch), timeout=3)

    def zero_window_echo(client: Raw) -> None:
        client.send(SettingsFrame(0, settings={4: 0}).serialize())
        client.send(client.headers(1, ECHO))
        body = b"\x00" + (MIB - 5).to_bytes(4, "big") + b"e" * (MIB - 5)
        deadline = time.monotonic() + 3
        for _ in range(100):
            for start in range(0, len(body), 16_384):
                frame = DataFrame(1, data=body[start : start + 16_384]).serialize()
                if time.monotonic() > deadline or not client.send(frame, timeout=0.5):
                    return

    measured("pings_50k", pings)
    measured("unknown_methods_100kb_paths", long_paths)
    measured("zero_window_echo_100x1mib", zero_window_echo)
    return growth


@contextlib.contextmanager
def server_process(kind: str, streams: int, code: Path | None = None):
    """The server in a subprocess; `code`: a tree whose epp it runs
    (default: this one's)."""
    with tempfile.TemporaryDirectory(prefix="epp-transport-bench-") as directory:
        port_file = Path(directory) / "port"
        env = dict(os.environ)
        if code is not None:
            env["PYTHONPATH"] = str(code)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.transport_limits",
                "serve",
                kind,
                str(port_file),
                str(streams),
            ],
            cwd=code,
            env=env,
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start")
                time.sleep(0.05)
            yield process.pid, int(port_file.read_text())
        finally:
            process.kill()
            process.wait()


def measure(kind: str, streams: int, frames: int) -> dict:
    with server_process(kind, streams) as (pid, port):
        cost = per_frame(port, pid, streams, frames)
    with server_process(kind, streams) as (pid, port):
        reset = rapid_reset(port, pid)
    with server_process(kind, streams) as (pid, port):
        memory = never_reading(port, pid)
    return {
        "server": kind,
        "cpu_us_per_frame": cost,
        "rapid_reset": reset,
        "memory_mib": memory,
    }


def compare(ref: str, streams: int, frames: int, rounds: int) -> dict:
    """Per-frame cost of epp at git `ref` (before) and of this tree (after),
    in alternating rounds."""
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="epp-transport-before-") as directory:
        archive = subprocess.run(["git", "archive", ref], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
        for _ in range(rounds):
            for name, code in (("before", Path(directory)), ("after", None)):
                with server_process("epp", streams, code) as (pid, port):
                    runs[name].append(per_frame(port, pid, streams, frames))
    return {"before_ref": ref, **runs}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        kind, port_file, streams = argv[1], Path(argv[2]), int(argv[3])
        serve_epp(port_file, streams) if kind == "epp" else serve_grpclib(port_file)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=["epp", "grpclib"], default="epp")
    parser.add_argument("--streams", type=int, default=50_000)
    parser.add_argument("--frames", type=int, default=20_000, help="frames per measurement")
    parser.add_argument(
        "--against",
        metavar="REF",
        help="only the per-frame costs, of epp at git REF and of this tree, alternately",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --against")
    args = parser.parse_args(argv)
    if args.against:
        print(json.dumps(compare(args.against, args.streams, args.frames, args.rounds)))
    else:
        print(json.dumps(measure(args.server, args.streams, args.frames)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
