"""Benchmark of the MCP door: a tool call's round trip beside the Python client's publish→ack.

    python bench/mcp_bench.py [--calls N]

One real ``agora serve`` (subprocess, SQLite log on disk, durable appends) with its HTTP port;
each measurement is ``N`` sequential calls after a warm-up, each writing one ``messagePosted``:

- **Python client** ``ws.post_message`` (``publish`` → ``ack`` over WebSocket): the floor.
- **MCP over stdio**: the official SDK's ``ClientSession.call_tool("post_message")`` to
  ``agora mcp`` (a subprocess: JSON-RPC on its stdin/stdout, then the same publish → ack).
- **MCP over Streamable HTTP**: the same call to ``/mcp`` on the hub's HTTP port (one POST per
  call, the result on an SSE stream, then the publish → ack inside the hub process).

Prints p50 and p99 (ms) of one run, and each MCP p50 over the Python client's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx2  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from hub.auth import TokenSigner  # noqa: E402
from hub.client import connect  # noqa: E402

SECRET = "mcp-bench-secret-0123456789-abcdefghijklmnop"
WARMUP = 20


def start_serve(data: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    argv = [sys.executable, "-m", "hub", "serve", "--port", "0", "--a2a-port", "0"]
    env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(ROOT))
    log = (data.parent / "serve.log").open("ab")
    proc = subprocess.Popen(
        [*argv, "--data", str(data)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log
    )
    assert proc.stdout is not None
    ws = re.search(r"(ws://\S+)", proc.stdout.readline().decode())
    http = re.search(r"(http://\S+)", proc.stdout.readline().decode())
    assert ws and http, "agora serve did not start"
    return proc, ws.group(1), http.group(1)


async def timed(call: Callable[[int], Awaitable[object]], n: int) -> list[float]:
    for i in range(WARMUP):
        await call(-1 - i)
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append(time.perf_counter() - start)
    return samples


@contextlib.asynccontextmanager
async def stdio_session(url: str, token: str) -> AsyncIterator[ClientSession]:
    env = {"AGORA_TOKEN": token, "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    argv = ["-m", "hub", "mcp", "--url", url, "--workspace", "bench-stdio"]
    params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=str(ROOT))
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(base: str, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as client,
        streamable_http_client(base + "/mcp?workspace=bench-http", http_client=client) as (r, w),
        ClientSession(r, w) as session,
    ):
        await session.initialize()
        yield session


def tool_call(session: ClientSession) -> Callable[[int], Awaitable[object]]:
    async def call(i: int) -> object:
        result = await session.call_tool("post_message", {"text": f"m{i}"})
        assert not result.is_error, result.content
        return result

    return call


async def run(args: argparse.Namespace) -> None:
    signer = TokenSigner(SECRET.encode())
    token = signer.issue("bench", ["*"], ["read", "write"], ttl_seconds=3600)
    with tempfile.TemporaryDirectory() as tmp:
        proc, ws_url, http_url = start_serve(Path(tmp) / "data")
        results: dict[str, list[float]] = {}
        try:
            async with connect(ws_url, token) as session:
                ws = session.workspace("bench-client")

                async def publish(i: int) -> object:
                    return await ws.post_message(f"m{i}")

                results["Python client publish→ack"] = await timed(publish, args.calls)
            async with stdio_session(ws_url, token) as mcp:
                results["MCP tool call, stdio"] = await timed(tool_call(mcp), args.calls)
            async with http_session(http_url, token) as mcp:
                results["MCP tool call, Streamable HTTP"] = await timed(tool_call(mcp), args.calls)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    floor = statistics.median(results["Python client publish→ack"])
    print(f"MCP benchmark (one run, {args.calls} sequential calls each, after {WARMUP} warm-up)")
    print(f"{'':34} {'p50 ms':>8} {'p99 ms':>8} {'p50 / client':>13}")
    for name, samples in results.items():
        samples.sort()
        p50 = statistics.median(samples)
        p99 = samples[max(0, int(len(samples) * 0.99) - 1)]
        print(f"{name:34} {p50 * 1000:8.2f} {p99 * 1000:8.2f} {p50 / floor:12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per measurement")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
