"""Cluster benchmark: ``agora serve`` nodes sharing one PostgreSQL log, beside one SQLite node.

    python bench/cluster_bench.py [--quick] [--store postgresql://…] [--repeats N]

Every configuration runs real ``agora serve`` processes (data directories on the real disk,
durable appends in the path); this driver is the single timing process holding every client,
so publish and receipt times come from one clock. Configurations, in one run:

- SQLite, 1 node: the embedded default;
- PostgreSQL, 1 node;
- PostgreSQL, 2 nodes on one schema.

Measured, medians of ``--repeats`` runs (default 3):

- **appends/s**: 64 concurrent publishers, each a connection publishing single-event batches in
  a closed loop (the next once the previous is acknowledged), spread round-robin over the nodes
  (32 per node with two), into 8 workspaces each written from every node;
- **publish → deliver p50/p99**: one publisher on the first node, one subscriber on the last
  (with two nodes: on the other node, so each event travels node A → PostgreSQL → NOTIFY →
  node B → subscriber), one event at a time.

``--store`` (default ``$AGORA_TEST_POSTGRES`` or the local ``test`` database): without a
``schema`` parameter each configuration gets a fresh ``cluster_bench_<hex>`` schema, dropped
afterwards; with one, that schema is used as is and kept.

The measuring functions (:func:`appends_per_second`, :func:`publish_to_deliver`) take node
ports and a token, and :func:`start_nodes` starts nodes on any store URL, so other benches can
import them (``from bench.cluster_bench import …`` with the repository root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT: Final = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, also when imported
from rawws import RawClient  # noqa: E402

SECRET: Final = "cluster-bench-secret-0123456789abcdef0123456789"
DEFAULT_STORE: Final = os.environ.get(
    "AGORA_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
BANNER: Final = re.compile(rb"agora serving ws://[^:\s]+:(\d+)")
PUBLISHERS: Final = 64
WORKSPACES: Final = 8
TEXT: Final = "x" * 64  # a short chat message

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


# ---------------------------------------------------------------------------------------------
# Nodes


@dataclass
class Node:
    """One ``agora serve`` process."""

    port: int
    proc: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def token() -> str:
    """A token every node of :func:`start_nodes` accepts (read, write, every workspace)."""
    from hub.auth import TokenSigner

    return TokenSigner(SECRET.encode()).issue("bench", ["*"], ["read", "write"], ttl_seconds=86400)


def start_node(store_url: str | None, workdir: Path) -> Node:
    """Start ``agora serve`` on ``store_url`` (None: SQLite in ``workdir``/data) and wait for
    its banner. Publish rate limits are lifted (a policy, not a capacity)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = (
        "[server]\na2a_port = 0\n\n[limits]\npublish_rate = 1000000.0\n"
        "max_connections_per_agent = 1024\n"
    )
    config += "publish_burst = 1000000\n"
    if store_url is not None:
        config += f'\n[storage]\nstore = "{store_url}"\n'
    (workdir / "agora.toml").write_text(config)
    log = workdir / "node.log"
    argv = [sys.executable, "-m", "hub", "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--data", str(workdir / "data"), "--config", str(workdir / "agora.toml")]
    env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(ROOT))
    env.pop("PYTHONASYNCIODEBUG", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = BANNER.search(log.read_bytes())
        if match:
            return Node(int(match.group(1)), proc, workdir)
        if proc.poll() is not None:
            raise RuntimeError(f"agora serve exited: {log.read_text(errors='replace')}")
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"agora serve printed no banner: {log.read_text(errors='replace')}")


@contextlib.contextmanager
def start_nodes(store_url: str | None, count: int) -> Iterator[list[Node]]:
    """``count`` nodes on one store (SQLite: ``count`` must be 1), stopped on exit. A
    PostgreSQL URL without ``schema`` gets a fresh one, dropped on exit."""
    if store_url is None and count != 1:
        raise ValueError("SQLite serves one node")
    fresh = None
    if store_url is not None:
        store_url, fresh = _with_schema(store_url)
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None  # a real disk, not tmpfs
    workdir = Path(tempfile.mkdtemp(prefix="agora-cluster-bench-", dir=base))
    nodes: list[Node] = []
    try:
        for i in range(count):
            nodes.append(start_node(store_url, workdir / f"node-{i}"))
        yield nodes
    finally:
        for node in nodes:
            node.stop()
        if fresh is not None:
            asyncio.run(_drop_schema(store_url or "", fresh))
        shutil.rmtree(workdir, ignore_errors=True)


def _with_schema(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "schema" for k, _ in query):
        return url, None
    schema = f"cluster_bench_{uuid.uuid4().hex[:12]}"
    query.append(("schema", schema))
    return urlunsplit(parts._replace(query=urlencode(query))), schema


async def _drop_schema(url: str, schema: str) -> None:
    import asyncpg

    from hub.log.postgres import parse_url

    dsn, _ = parse_url(url)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


# ---------------------------------------------------------------------------------------------
# Measurements


async def appends_per_second(
    ports: list[int],
    token: str,
    *,
    publishers: int = PUBLISHERS,
    workspaces: int = WORKSPACES,
    seconds: float = 5.0,
    warmup: float = 0.5,
    prefix: str = "appends",
) -> float:
    """Acknowledged single-event publishes per second from ``publishers`` closed-loop
    publishers spread round-robin over ``ports``, into ``workspaces`` workspaces (publisher
    ``i`` writes workspace ``(i // len(ports)) % workspaces``, so each is written from every
    node), counted over ``seconds`` after ``warmup``."""
    loop = asyncio.get_running_loop()
    counting = False
    acked = 0
    stop = False
    clients: list[RawClient] = []
    errors: list[str] = []

    def publisher(i: int) -> Callable[[bytes], None]:
        workspace = f"{prefix}-{(i // len(ports)) % workspaces}"
        rid = itertools.count(1)
        message = {"kind": "messagePosted", "payload": {"text": TEXT}}

        def send() -> None:
            frame = {"op": "publish", "rid": next(rid), "workspace": workspace}
            clients[i].send(_encode({**frame, "event": message}))

        def on_frame(payload: bytes) -> None:
            nonlocal acked
            if b'"op":"ack"' in payload:
                if counting:
                    acked += 1
            elif b'"op":"error"' in payload:
                errors.append(payload.decode())  # not counted; the publisher goes on
            else:
                return
            if not stop:
                send()

        on_frame.send = send  # type: ignore[attr-defined]
        return on_frame

    handlers = [publisher(i) for i in range(publishers)]
    for i, handler in enumerate(handlers):
        clients.append(await RawClient.open(ports[i % len(ports)], handler, token=token))
    try:
        for handler in handlers:
            handler.send()  # type: ignore[attr-defined]
        await asyncio.sleep(warmup)
        counting = True
        start = loop.time()
        await asyncio.sleep(seconds)
        counting = False
        elapsed = loop.time() - start
        if errors:
            print(f"  {len(errors)} publishes refused, e.g. {errors[0]}", file=sys.stderr)
        return acked / elapsed
    finally:
        stop = True
        await asyncio.sleep(0.2)  # let the last acks arrive before closing
        for client in clients:
            client.close()


async def publish_to_deliver(
    publish_port: int,
    subscribe_port: int,
    token: str,
    *,
    samples: int = 300,
    pause: float = 0.002,
    workspace: str | None = None,
) -> list[float]:
    """Seconds from sending a publish on ``publish_port`` to receiving its ``event`` frame on
    a subscriber of ``subscribe_port``, one event at a time (the next after both the ack and
    the delivery, and ``pause``)."""
    loop = asyncio.get_running_loop()
    workspace = workspace or f"latency-{uuid.uuid4().hex[:8]}"
    waiting: dict[str, asyncio.Future[float]] = {}
    acked: asyncio.Future[None] | None = None
    subscribed: asyncio.Future[None] = loop.create_future()

    def on_event(payload: bytes) -> None:
        message = _decode(payload)
        op = message.get("op")
        if op == "subscribed" and not subscribed.done():
            subscribed.set_result(None)
        elif op == "event":
            future = waiting.pop(message["event"]["id"], None)
            if future is not None and not future.done():
                future.set_result(time.perf_counter())

    def on_reply(payload: bytes) -> None:
        if acked is not None and not acked.done():
            if b'"op":"ack"' in payload:
                acked.set_result(None)
            else:
                acked.set_exception(RuntimeError(payload.decode()))

    subscriber = await RawClient.open(subscribe_port, on_event, token=token)
    publisher = await RawClient.open(publish_port, on_reply, token=token)
    try:
        subscriber.send(_encode({"op": "subscribe", "rid": 1, "workspace": workspace}))
        async with asyncio.timeout(10):
            await subscribed
        latencies: list[float] = []
        for n in range(samples + 10):
            event_id = f"lat-{uuid.uuid4().hex}"
            delivered = waiting[event_id] = loop.create_future()
            acked = loop.create_future()
            event = {"kind": "messagePosted", "id": event_id, "payload": {"text": TEXT}}
            sent = time.perf_counter()
            publisher.send(
                _encode({"op": "publish", "rid": n, "workspace": workspace, "event": event})
            )
            async with asyncio.timeout(10):
                received = await delivered
                await acked
            if n >= 10:  # the first few warm up the path
                latencies.append(received - sent)
            await asyncio.sleep(pause)
        return latencies
    finally:
        subscriber.close()
        publisher.close()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class Figures:
    appends: list[float]
    p50_ms: list[float]
    p99_ms: list[float]

    def median(self) -> tuple[float, float, float]:
        return (
            statistics.median(self.appends),
            statistics.median(self.p50_ms),
            statistics.median(self.p99_ms),
        )


async def _measure(ports: list[int], repeats: int, quick: bool, label: str) -> Figures:
    figures = Figures([], [], [])
    secret = token()
    run_id = uuid.uuid4().hex[:6]  # fresh workspaces, even on a kept schema
    for r in range(repeats):
        rate = await appends_per_second(
            ports, secret, seconds=1.5 if quick else 5.0, prefix=f"appends-{run_id}-{r}"
        )
        lat = await publish_to_deliver(ports[0], ports[-1], secret, samples=100 if quick else 300)
        figures.appends.append(rate)
        figures.p50_ms.append(percentile(lat, 50) * 1000)
        figures.p99_ms.append(percentile(lat, 99) * 1000)
        print(
            f"  {label:<22} run {r + 1}: {rate:>9,.0f} appends/s   "
            f"p50 {figures.p50_ms[-1]:.2f} ms   p99 {figures.p99_ms[-1]:.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    return figures


def run(store_url: str, *, quick: bool, repeats: int) -> dict[str, Figures]:
    """Every configuration, in this order: SQLite 1 node, PostgreSQL 1 node, 2 nodes."""
    configs: list[tuple[str, str | None, int]] = [
        ("SQLite, 1 node", None, 1),
        ("PostgreSQL, 1 node", store_url, 1),
        ("PostgreSQL, 2 nodes", store_url, 2),
    ]
    results: dict[str, Figures] = {}
    for label, url, count in configs:
        with start_nodes(url, count) as nodes:
            ports = [n.port for n in nodes]
            results[label] = asyncio.run(_measure(ports, repeats, quick, label))
    return results


def report(results: dict[str, Figures], repeats: int) -> str:
    labels = list(results)
    base = results[labels[0]].median()
    lines = [
        f"cluster_bench: {PUBLISHERS} publishers over the nodes, {WORKSPACES} workspaces; "
        f"medians of {repeats} runs",
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores (nodes, PostgreSQL and this driver share them)",
        "",
        f"{'':<32}" + "".join(f"{label:>22}" for label in labels),
    ]
    rows = [
        ("appends/s (64 publishers)", 0, "{:,.0f}"),
        ("publish→deliver p50 (ms)", 1, "{:.2f}"),
        ("publish→deliver p99 (ms)", 2, "{:.2f}"),
    ]
    for name, index, fmt in rows:
        cells = []
        for label in labels:
            value = results[label].median()[index]
            ratio = value / base[index] if base[index] else 0.0
            cells.append(f"{fmt.format(value)} ({ratio:.2f}x)")
        lines.append(f"{name:<32}" + "".join(f"{c:>22}" for c in cells))
    lines.append("")
    lines.append("(ratios against SQLite, 1 node; latency with 2 nodes is cross-node)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--store", default=DEFAULT_STORE, help="a postgresql:// URL")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    results = run(args.store, quick=args.quick, repeats=args.repeats)
    print(report(results, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
