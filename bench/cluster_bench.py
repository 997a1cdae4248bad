"""Cluster benchmark: ``agora serve`` nodes sharing one PostgreSQL log, beside one SQLite node.

    python bench/cluster_bench.py [--quick] [--store postgresql://…] [--repeats N]
                                  [--nodes 1,2,3] [--owners]

Every configuration runs real ``agora serve`` processes (data directories on the real disk,
durable appends in the path); this driver is the single timing process holding every client,
so publish and receipt times come from one clock. Configurations, in one run:

- SQLite, 1 node: the embedded default;
- PostgreSQL, 1, 2 and 3 nodes on one schema (``--nodes``); with ``--owners`` each node runs
  with ``[cluster] owners`` (one node decides each workspace; a publisher connected to another
  node is relayed to it, so "disjoint" and "shared" then say where the clients connect, not
  which node decides).

Measured, medians of ``--repeats`` runs (default 3), after one pass per configuration that is
not counted (a fresh node's first run opens its connections and warms its caches):

- **appends/s**: 64 concurrent publishers, each a connection publishing single-event batches in
  a closed loop (the next once the previous is acknowledged), spread round-robin over the nodes,
  into 12 workspaces, in two layouts:

  - *disjoint*: each workspace is written through one node only (node ``j`` owns the
    workspaces ``k`` with ``k % nodes == j``): no node has another node's workspaces open, so
    the only shared resource is the log itself;
  - *shared*: every workspace is written through every node, so every node also catches up
    (reads back and folds) what the others append to it after each NOTIFY.

  With one node the two layouts are the same thing; it is measured once.
- **CPU per event**: user + system CPU of every node process (``/proc/<pid>/stat``) over the
  counted window, divided by the events acknowledged in it; and the same for every PostgreSQL
  process on the machine (all backends: other users of the server count too).
- **publish → deliver p50/p99**: one publisher on the first node, one subscriber on the last
  (with several nodes: on another node, so each event travels node A → PostgreSQL → NOTIFY →
  node B → subscriber), one event at a time.

The ratios printed are the issue's: appends/s of 2 (and 3) nodes over 1 PostgreSQL node, on
disjoint workspaces (target ≥ 1.7x for 2 nodes) and on shared ones (target ≥ 1.0x). They are
about capacity, so they only mean something when the nodes have cores of their own: on one
machine the nodes, PostgreSQL and this driver share its cores.

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
WORKSPACES: Final = 12  # divisible by 1, 2 and 3 nodes (the disjoint layout)
LAYOUTS: Final = ("disjoint", "shared")
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


def start_node(store_url: str | None, workdir: Path, *, owners: bool = False) -> Node:
    """Start ``agora serve`` on ``store_url`` (None: SQLite in ``workdir``/data) and wait for
    its banner. Publish rate limits are lifted (a policy, not a capacity). ``owners``: with
    ``[cluster] owners`` (each workspace decided by one node, the others relaying to it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = (
        "[server]\na2a_port = 0\n\n[limits]\npublish_rate = 1000000.0\n"
        "max_connections_per_agent = 1024\n"
    )
    config += "publish_burst = 1000000\n"
    if store_url is not None:
        config += f'\n[storage]\nstore = "{store_url}"\n'
    if owners:
        config += "\n[cluster]\nowners = true\n"
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
def start_nodes(store_url: str | None, count: int, *, owners: bool = False) -> Iterator[list[Node]]:
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
            nodes.append(start_node(store_url, workdir / f"node-{i}", owners=owners))
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


def workspace_of(i: int, nodes: int, workspaces: int, layout: str) -> int:
    """The workspace publisher ``i`` writes (it is connected to node ``i % nodes``).

    ``shared``: ``(i // nodes) % workspaces``, so each workspace has publishers on every node;
    ``disjoint``: one of the workspaces ``k`` with ``k % nodes`` = its node, so each workspace
    is written through one node only."""
    if layout == "shared":
        return (i // nodes) % workspaces
    if layout != "disjoint":
        raise ValueError(f"unknown layout {layout!r}")
    node, per_node = i % nodes, workspaces // nodes
    if per_node < 1:
        raise ValueError("need at least one workspace per node")
    return node + nodes * ((i // nodes) % per_node)


_TICK_S: Final = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


def postgres_pids() -> list[int]:
    """Every PostgreSQL process on this machine (server and backends), by ``comm``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_bytes().strip() in (b"postgres", b"postmaster"):
                    pids.append(int(entry.name))
    return pids


@dataclass
class Rate:
    """One appends/s measurement: the rate, and CPU seconds per acknowledged event of the
    nodes (all together) and of PostgreSQL (None: not measured)."""

    per_second: float
    node_cpu_per_event: float | None = None
    postgres_cpu_per_event: float | None = None


async def appends_per_second(
    ports: list[int],
    token: str,
    *,
    layout: str = "shared",
    publishers: int = PUBLISHERS,
    workspaces: int = WORKSPACES,
    seconds: float = 5.0,
    warmup: float = 0.5,
    prefix: str = "appends",
    pids: list[int] | None = None,
) -> Rate:
    """Acknowledged single-event publishes per second from ``publishers`` closed-loop
    publishers spread round-robin over ``ports``, into ``workspaces`` workspaces laid out as
    ``layout`` says (:func:`workspace_of`), counted over ``seconds`` after ``warmup``. With
    ``pids`` (the nodes' processes) the CPU they and PostgreSQL spend per event too."""
    loop = asyncio.get_running_loop()
    counting = False
    acked = 0
    stop = False
    clients: list[RawClient] = []
    errors: list[str] = []

    def publisher(i: int) -> Callable[[bytes], None]:
        workspace = f"{prefix}-{workspace_of(i, len(ports), workspaces, layout)}"
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
        # Generous: on a loaded shared machine a node may take seconds to accept 64 at once.
        port = ports[i % len(ports)]
        clients.append(await RawClient.open(port, handler, token=token, within=60.0))
    pg = postgres_pids() if pids else []
    try:
        for handler in handlers:
            handler.send()  # type: ignore[attr-defined]
        await asyncio.sleep(warmup)
        node_cpu = sum(cpu_seconds(p) for p in pids or ())
        pg_cpu = sum(cpu_seconds(p) for p in pg)
        counting = True
        start = loop.time()
        await asyncio.sleep(seconds)
        counting = False
        elapsed = loop.time() - start
        node_cpu = sum(cpu_seconds(p) for p in pids or ()) - node_cpu
        pg_cpu = sum(cpu_seconds(p) for p in pg) - pg_cpu
        if errors:
            print(f"  {len(errors)} publishes refused, e.g. {errors[0]}", file=sys.stderr)
        rate = Rate(acked / elapsed)
        if pids and acked:
            rate.node_cpu_per_event = node_cpu / acked
            rate.postgres_cpu_per_event = pg_cpu / acked if pg else None
        return rate
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
    """The runs of one configuration: per layout, appends/s and CPU seconds per event (nodes,
    PostgreSQL); publish → deliver percentiles."""

    appends: dict[str, list[float]]
    node_cpu: dict[str, list[float]]
    postgres_cpu: dict[str, list[float]]
    p50_ms: list[float]
    p99_ms: list[float]

    @classmethod
    def empty(cls) -> Figures:
        return cls({}, {}, {}, [], [])

    def rate(self, layout: str) -> float:
        return statistics.median(self.appends[layout])

    def cpu_us(self, layout: str, of: str = "node") -> float | None:
        values = (self.node_cpu if of == "node" else self.postgres_cpu).get(layout)
        return statistics.median(values) * 1e6 if values else None


async def _measure(nodes: list[Node], repeats: int, quick: bool, label: str) -> Figures:
    figures = Figures.empty()
    ports, pids = [n.port for n in nodes], [n.proc.pid for n in nodes]
    secret = token()
    run_id = uuid.uuid4().hex[:6]  # fresh workspaces, even on a kept schema
    layouts = LAYOUTS if len(nodes) > 1 else LAYOUTS[1:]  # one node: the two are one
    # One pass not counted: a fresh node's first run (its pool's connections opened, its
    # statements prepared, its caches cold) went at about half the rate of the next ones, and
    # a 1 s pass was not enough (docs/operations.md, "Measured").
    for layout in layouts:
        await appends_per_second(
            ports,
            secret,
            layout=layout,
            seconds=3.0 if quick else 5.0,
            prefix=f"appends-{run_id}-{layout}-warm",
        )
    for r in range(repeats):
        cells = []
        for layout in layouts:
            rate = await appends_per_second(
                ports,
                secret,
                layout=layout,
                seconds=1.5 if quick else 5.0,
                prefix=f"appends-{run_id}-{layout}-{r}",
                pids=pids,
            )
            targets = LAYOUTS if len(nodes) == 1 else (layout,)
            for name in targets:
                figures.appends.setdefault(name, []).append(rate.per_second)
                if rate.node_cpu_per_event is not None:
                    figures.node_cpu.setdefault(name, []).append(rate.node_cpu_per_event)
                if rate.postgres_cpu_per_event is not None:
                    figures.postgres_cpu.setdefault(name, []).append(rate.postgres_cpu_per_event)
            cpu = rate.node_cpu_per_event
            cells.append(
                f"{layout} {rate.per_second:>7,.0f}/s"
                + (f" ({cpu * 1e6:.0f} µs node CPU/event)" if cpu is not None else "")
            )
        lat = await publish_to_deliver(ports[0], ports[-1], secret, samples=100 if quick else 300)
        figures.p50_ms.append(percentile(lat, 50) * 1000)
        figures.p99_ms.append(percentile(lat, 99) * 1000)
        print(
            f"  {label:<22} run {r + 1}: {'   '.join(cells)}   "
            f"p50 {figures.p50_ms[-1]:.2f} ms   p99 {figures.p99_ms[-1]:.2f} ms",
            file=sys.stderr,
            flush=True,
        )
    return figures


def run(
    store_url: str,
    *,
    quick: bool,
    repeats: int,
    counts: tuple[int, ...] = (1, 2, 3),
    owners: bool = False,
) -> dict[str, tuple[int, Figures]]:
    """Every configuration, in this order: SQLite 1 node, then PostgreSQL with each of
    ``counts`` nodes (with ``[cluster] owners`` when ``owners``). Label -> (nodes, figures)."""
    configs: list[tuple[str, str | None, int]] = [("SQLite, 1 node", None, 1)]
    configs += [(f"PostgreSQL, {n} node{'s' if n > 1 else ''}", store_url, n) for n in counts]
    results: dict[str, tuple[int, Figures]] = {}
    for label, url, count in configs:
        with start_nodes(url, count, owners=owners and url is not None) as nodes:
            results[label] = (count, asyncio.run(_measure(nodes, repeats, quick, label)))
    return results


TARGETS: Final = {"disjoint": 1.7, "shared": 1.0}
"""The issue's targets for 2 PostgreSQL nodes over 1 (appends/s)."""


def report(results: dict[str, tuple[int, Figures]], repeats: int) -> str:
    def cpu(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [
        f"cluster_bench: {PUBLISHERS} publishers over the nodes, {WORKSPACES} workspaces; "
        f"medians of {repeats} runs",
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores (nodes, PostgreSQL and this driver share them)",
        "",
        f"{'':<22}{'appends/s':>22}{'node CPU µs/event':>22}{'PostgreSQL CPU µs/ev':>22}"
        f"{'deliver ms':>14}",
        f"{'':<22}{'disjoint':>11}{'shared':>11}{'disjoint':>11}{'shared':>11}"
        f"{'disjoint':>11}{'shared':>11}{'p50':>7}{'p99':>7}",
    ]
    for label, (_, f) in results.items():
        lines.append(
            f"{label:<22}{f.rate('disjoint'):>11,.0f}{f.rate('shared'):>11,.0f}"
            f"{cpu(f.cpu_us('disjoint')):>11}{cpu(f.cpu_us('shared')):>11}"
            f"{cpu(f.cpu_us('disjoint', 'pg')):>11}{cpu(f.cpu_us('shared', 'pg')):>11}"
            f"{statistics.median(f.p50_ms):>7.2f}{statistics.median(f.p99_ms):>7.2f}"
        )
    postgres = {n: f for label, (n, f) in results.items() if label.startswith("PostgreSQL")}
    if 1 in postgres:
        one = postgres[1]
        lines.append("")
        lines.append("appends/s over PostgreSQL, 1 node (the issue's targets are for 2 nodes):")
        for n, f in sorted(postgres.items()):
            if n == 1:
                continue
            cells = []
            for layout in LAYOUTS:
                ratio = f.rate(layout) / one.rate(layout) if one.rate(layout) else 0.0
                target = TARGETS[layout]
                mark = ""
                if n == 2:
                    verdict = "met" if ratio >= target else "NOT met"
                    mark = f" (target ≥{target:.1f}x: {verdict})"
                cells.append(f"{layout} {ratio:.2f}x{mark}")
            lines.append(f"  {n} nodes: " + ", ".join(cells))
    lines.append("")
    lines.append("(latency with several nodes is cross-node: first node → last node)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test)")
    parser.add_argument("--store", default=DEFAULT_STORE, help="a postgresql:// URL")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    parser.add_argument(
        "--nodes", default="1,2,3", help="PostgreSQL node counts, comma-separated (1-3)"
    )
    parser.add_argument(
        "--owners",
        action="store_true",
        help="PostgreSQL nodes with [cluster] owners: one node decides each workspace",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    try:
        counts = tuple(sorted({int(n) for n in args.nodes.split(",")}))
    except ValueError:
        parser.error("--nodes: comma-separated integers")
    if not counts or not all(1 <= n <= 3 for n in counts):
        parser.error("--nodes: between 1 and 3 (12 workspaces split over the nodes)")
    results = run(
        args.store, quick=args.quick, repeats=args.repeats, counts=counts, owners=args.owners
    )
    print(report(results, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
