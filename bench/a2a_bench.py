"""Benchmark of the A2A adapter against the a2a-sdk's own in-memory server.

    python bench/a2a_bench.py [--quick] [--repeats N]

One process, loopback HTTP, the a2a-sdk Python client on both sides of the comparison:

- **SendMessage → COMPLETED latency** (blocking ``SendMessage``, p50/p99 over sequential
  calls). Agora: the hub (SQLite log on disk, durable appends) with a trivial workspace member
  that claims and completes each work item through ``Workspaces`` — three appends and the
  fan-out per call. Peer: the a2a-sdk ``DefaultRequestHandler`` + ``InMemoryTaskStore`` with
  an ``AgentExecutor`` that completes at once (no durability).
- **Streaming event rate** (``SendStreamingMessage``, updates/s received by the client). Agora:
  the member publishes N ``workPublished`` events, one append each; peer: the executor
  enqueues N artifact updates.

Prints medians of ``--repeats`` runs and the ratio agora/peer (lower is better for latency,
higher for rate).

Then the reads (``--reads-only`` runs just these):

- **ListTasks p50 vs history**: ``ListTasks(pageSize=1)`` on a workspace holding 10^3 and one
  holding 10^5 events (chat messages plus one work item per 100 events), after one warm-up call
  (reported too: it builds the task index). Flat is the goal.
- **Push latency**: ``completed`` appended → the webhook (loopback) has the POST, p50.
- **WebSocket ``state`` under A2A reads**: a real ``agora serve`` (subprocess, SQLite) whose log
  holds a ~50 MB workspace; ``state`` round trips on *another* (small) workspace, quiet and
  while two loops of ``ListTasks(pageSize=1)``/``GetTask`` hit the big one over JSON-RPC.
  The ratio loaded/quiet of the p50s, from one run, is what the issue asks to keep near 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from a2a.client import Client, ClientConfig, ClientFactory  # noqa: E402
from a2a.types.a2a_pb2 import (  # noqa: E402
    AgentCard,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from google.protobuf import json_format  # noqa: E402

from a2a_adapter.app import A2AService  # noqa: E402
from hub.auth import TokenSigner  # noqa: E402
from hub.config import A2AConfig, HubConfig, PushSettings  # noqa: E402
from hub.core.events import (  # noqa: E402
    Completed,
    Event,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkClaimed,
    WorkPublished,
)
from hub.follow import LogFollower  # noqa: E402
from hub.log.sqlite import SqliteEventStore  # noqa: E402
from hub.workspaces import Workspaces  # noqa: E402
from tests.a2a_adapter.echo_agent import echo_agent  # noqa: E402
from tests.a2a_adapter.webhook import WebhookReceiver  # noqa: E402
from tests.support.a2a import a2a_listening  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from rawws import RawClient  # noqa: E402

SECRET = b"a2a-bench-secret-0123456789abcdef0123456789"
WORKSPACE = "bench"


async def member(workspaces: Workspaces, follower: LogFollower) -> None:
    """Claims every needWork; ``burst N`` gets N workPublished events, anything else none."""
    head = await workspaces.head(WORKSPACE)
    async with contextlib.aclosing(follower.follow(WORKSPACE, head)) as events:
        async for ev in events:
            if not isinstance(ev, NeedWork) or not ev.correlation_id:
                continue
            cid = ev.correlation_id
            text = ev.payload["parts"][0]["text"]
            await workspaces.publish(WORKSPACE, [WorkClaimed(correlation_id=cid)], producer="bob")
            if text.startswith("burst "):
                for i in range(int(text.split()[1])):
                    payload = {"artifactId": "burst", "parts": [{"text": f"chunk {i}"}]}
                    if i:
                        payload["append"] = True
                    await workspaces.publish(
                        WORKSPACE,
                        [WorkPublished(correlation_id=cid, payload=payload)],
                        producer="bob",
                    )
            await workspaces.publish(WORKSPACE, [Completed(correlation_id=cid)], producer="bob")


@contextlib.asynccontextmanager
async def client_for(card_url: str, token: str | None, streaming: bool) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = AgentCard()
        json_format.ParseDict((await http.get(card_url)).json(), card, ignore_unknown_fields=True)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
        try:
            yield client
        finally:
            await client.close()


def request(text: str, context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(
        message=Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            context_id=context_id,
            parts=[Part(text=text)],
        )
    )


async def latency(client: Client, n: int, context_id: str) -> tuple[float, float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        [response] = [r async for r in client.send_message(request(f"job {i}", context_id))]
        samples.append(time.perf_counter() - start)
        assert response.task.status.state == TaskState.TASK_STATE_COMPLETED, response
    samples.sort()
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.99) - 1] * 1000


async def stream_rate(client: Client, n: int, context_id: str) -> float:
    count = 0
    first = last = 0.0
    async for _ in client.send_message(request(f"burst {n}", context_id)):
        now = time.perf_counter()
        if count == 0:
            first = now
        last = now
        count += 1
    return (count - 1) / (last - first)


async def run(args: argparse.Namespace) -> None:
    n_lat = 50 if args.quick else 300
    n_stream = 300 if args.quick else 2000
    results: dict[str, list[float]] = {}

    def record(name: str, value: float) -> None:
        results.setdefault(name, []).append(value)

    with tempfile.TemporaryDirectory(prefix="a2a-bench-") as tmp:
        store = SqliteEventStore(Path(tmp) / "agora.db", blobs_dir=Path(tmp) / "blobs")
        async with store:
            workspaces = Workspaces(store)
            signer = TokenSigner(SECRET)
            token = signer.issue("peer", [WORKSPACE], ["read", "write"], ttl_seconds=3600)
            async with a2a_listening(
                A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=0)
            ) as svc:
                follower = LogFollower(workspaces)
                follower.install()
                worker = asyncio.create_task(member(workspaces, follower))
                card = svc.url + "/.well-known/agent-card.json"
                for _ in range(args.repeats):
                    async with client_for(card, token, streaming=False) as c:
                        p50, p99 = await latency(c, n_lat, WORKSPACE)
                        record("agora p50", p50)
                        record("agora p99", p99)
                    async with client_for(card, token, streaming=True) as c:
                        record("agora rate", await stream_rate(c, n_stream, WORKSPACE))
                worker.cancel()
                await follower.aclose()
                with contextlib.suppress(BaseException):
                    await worker
            await workspaces.aclose()
        async with echo_agent() as card:
            for _ in range(args.repeats):
                async with client_for(card, None, streaming=False) as c:
                    p50, p99 = await latency(c, n_lat, "")
                    record("sdk p50", p50)
                    record("sdk p99", p99)
                async with client_for(card, None, streaming=True) as c:
                    record("sdk rate", await stream_rate(c, n_stream, ""))

    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"A2A adapter benchmark ({args.repeats} runs, medians; {n_lat} calls, {n_stream} updates)"
    )
    print(f"{'measure':<34}{'agora':>12}{'a2a-sdk':>12}{'ratio':>9}")
    for label, a, b, unit in (
        ("SendMessage→COMPLETED p50 (ms)", "agora p50", "sdk p50", "ms"),
        ("SendMessage→COMPLETED p99 (ms)", "agora p99", "sdk p99", "ms"),
        ("stream updates/s", "agora rate", "sdk rate", "/s"),
    ):
        del unit
        print(f"{label:<34}{med[a]:>12.2f}{med[b]:>12.2f}{med[a] / med[b]:>9.2f}")


# ---------------------------------------------------------------------------------------------
# Reads: ListTasks against history, and the WebSocket hub while A2A reads run


async def seed(
    store: SqliteEventStore, workspace: str, events: int, *, text_bytes: int = 64
) -> None:
    """``events`` events: chat messages, one work item (needWork) in every 100."""
    workspaces = Workspaces(store)
    text = "m" * text_bytes
    batch: list[Event] = []
    for i in range(events):
        if i % 100 == 0:
            batch.append(NeedWork(correlation_id=f"{workspace}-t{i}", payload={"n": i}))
        else:
            batch.append(MessagePosted(payload=MessagePayload(text=text)))
        if len(batch) == 500 or i == events - 1:
            await workspaces.publish(workspace, batch, producer="seed")
            batch = []
    await workspaces.aclose()


async def list_p50(
    client: httpx.AsyncClient, url: str, workspace: str, n: int
) -> tuple[float, float]:
    """(first call ms, p50 ms of the next ``n``) for ListTasks(pageSize=1) over JSON-RPC."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks"}
    body["params"] = {"contextId": workspace, "pageSize": 1}
    samples = []
    for _ in range(n + 1):
        start = time.perf_counter()
        reply = (await client.post(url, json=body, headers={"A2A-Version": "1.0"})).json()
        samples.append((time.perf_counter() - start) * 1000)
        assert reply.get("result", {}).get("tasks"), reply
    return samples[0], statistics.median(samples[1:])


async def history_reads(args: argparse.Namespace) -> dict[str, float]:
    n = 20 if args.quick else 100
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="a2a-bench-") as tmp:
        store = SqliteEventStore(Path(tmp) / "agora.db", blobs_dir=Path(tmp) / "blobs")
        async with store:
            for size in (1_000, 100_000):
                await seed(store, f"h{size}", size)
            workspaces = Workspaces(store)
            signer = TokenSigner(SECRET)
            token = signer.issue("peer", ["*"], ["read", "write"], ttl_seconds=3600)
            async with a2a_listening(
                A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=0)
            ) as svc:
                headers = {"Authorization": f"Bearer {token}"}
                async with httpx.AsyncClient(headers=headers, timeout=600) as http:
                    for size in (1_000, 100_000):
                        first, p50 = await list_p50(http, svc.url + "/a2a/jsonrpc", f"h{size}", n)
                        out[f"ListTasks first call, {size} events (ms)"] = first
                        out[f"ListTasks p50, {size} events (ms)"] = p50
            await workspaces.aclose()
    return out


class StatePeer:
    """A WebSocket connection timing ``state`` round trips."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[bytes] = asyncio.Queue()
        self.client: RawClient | None = None

    async def open(self, port: int, token: str) -> None:
        self.client = await RawClient.open(port, self.replies.put_nowait, token=token)

    async def state_ms(self, workspace: str, rid: int) -> float:
        assert self.client is not None
        start = time.perf_counter()
        self.client.send(json.dumps({"op": "state", "rid": rid, "workspace": workspace}).encode())
        while True:
            reply = json.loads(await asyncio.wait_for(self.replies.get(), 120))
            if reply.get("rid") == rid:
                assert reply.get("op") == "state", reply
                return (time.perf_counter() - start) * 1000


def make_workdir() -> Path:
    # The real disk (not tmpfs): appends are durable (fsync) as in production.
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    return Path(tempfile.mkdtemp(prefix="a2a-bench-hub-", dir=base))


def start_serve(data: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``agora serve`` on free ports over the log in ``data``, its output in ``log_path``."""
    argv = [sys.executable, "-m", "hub", "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--a2a-port", "0", "--data", str(data)]
    env = dict(os.environ, AGORA_SECRET=SECRET.decode(), PYTHONPATH=str(ROOT))
    with log_path.open("wb") as log_out:
        return subprocess.Popen(argv, stdout=log_out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


async def hub_under_reads(args: argparse.Namespace) -> dict[str, float]:
    big_events = 5_000 if args.quick else 50_000  # ~1 KB each: ~5 / ~50 MB
    n_state = 50 if args.quick else 200
    workdir = make_workdir()
    out: dict[str, float] = {}
    proc: subprocess.Popen[bytes] | None = None
    try:
        data = workdir / "data"
        data.mkdir()
        async with SqliteEventStore(data / "agora.db", blobs_dir=data / "blobs") as store:
            await seed(store, "big", big_events, text_bytes=1000)
            await seed(store, "quiet", 20)
        out["big workspace size (MB)"] = (data / "agora.db").stat().st_size / 1e6
        log_path = workdir / "hub.log"
        proc = start_serve(data, log_path)
        ws_port = a2a_url = None
        deadline = time.monotonic() + 60
        while (ws_port is None or a2a_url is None) and time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            m = re.search(r"agora serving ws://[^:\s]+:(\d+)", text)
            ws_port = int(m.group(1)) if m else None
            m = re.search(r"agora A2A on (\S+)", text)
            a2a_url = m.group(1) if m else None
            if proc.poll() is not None:
                raise RuntimeError(text)
            await asyncio.sleep(0.05)
        assert ws_port is not None and a2a_url is not None, log_path.read_text()
        token = TokenSigner(SECRET).issue("bench", ["*"], ["read", "write"], ttl_seconds=3600)
        peer = StatePeer()
        await peer.open(ws_port, token)
        rid = iter(range(1, 1 << 30))
        for _ in range(10):  # warm up (opens the quiet workspace)
            await peer.state_ms("quiet", next(rid))
        quiet = [await peer.state_ms("quiet", next(rid)) for _ in range(n_state)]
        headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
        rpc = a2a_url.rstrip("/") + "/a2a/jsonrpc"
        async with httpx.AsyncClient(headers=headers, timeout=600) as http:
            start = time.perf_counter()
            listed = await http.post(
                rpc,
                json={
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "ListTasks",
                    "params": {"contextId": "big", "pageSize": 1},
                },
            )
            out["first ListTasks on big (ms)"] = (time.perf_counter() - start) * 1000
            task_id = listed.json()["result"]["tasks"][0]["id"]
            calls = 0
            stop = asyncio.Event()

            async def reader() -> None:
                nonlocal calls
                while not stop.is_set():
                    for method, params in (
                        ("ListTasks", {"contextId": "big", "pageSize": 1}),
                        ("GetTask", {"id": task_id}),
                    ):
                        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
                        reply = (await http.post(rpc, json=body)).json()
                        assert "result" in reply, reply
                        calls += 1

            readers = [asyncio.create_task(reader()) for _ in range(2)]
            await asyncio.sleep(0.5)
            began, before = time.perf_counter(), calls
            loaded = [await peer.state_ms("quiet", next(rid)) for _ in range(n_state)]
            out["A2A reads/s during the loaded phase"] = (calls - before) / (
                time.perf_counter() - began
            )
            stop.set()
            await asyncio.gather(*readers)
        assert peer.client is not None
        peer.client.close()
        out["state p50 quiet (ms)"] = statistics.median(quiet)
        out["state p50 under A2A reads (ms)"] = statistics.median(loaded)
        out["state p50 ratio loaded/quiet"] = statistics.median(loaded) / statistics.median(quiet)
        out["state max under A2A reads (ms)"] = max(loaded)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


async def push_latency(args: argparse.Namespace) -> dict[str, float]:
    """State change → webhook POST received: ``completed`` appended (one durable append), the
    push watcher maps it, checks the URL policy and POSTs to a loopback receiver, then the
    ``pushAttempted`` append. p50 over sequential tasks, one config each."""
    n = 30 if args.quick else 200
    samples: list[float] = []
    config = HubConfig(a2a=A2AConfig(push=PushSettings(allow_loopback=True)))
    with tempfile.TemporaryDirectory(prefix="a2a-bench-push-") as tmp:
        store = SqliteEventStore(Path(tmp) / "agora.db", blobs_dir=Path(tmp) / "blobs")
        async with store:
            workspaces = Workspaces(store)
            signer = TokenSigner(SECRET)
            token = signer.issue("peer", [WORKSPACE], ["read", "write"], ttl_seconds=3600)
            async with (
                a2a_listening(
                    A2AService(workspaces, signer, config, host="127.0.0.1", port=0)
                ) as svc,
                WebhookReceiver() as hook,
                client_for(svc.url + "/.well-known/agent-card.json", token, False) as client,
            ):
                for i in range(n):
                    req = request(f"push {i}", WORKSPACE)
                    req.configuration.return_immediately = True
                    [r] = [r async for r in client.send_message(req)]
                    await client.create_task_push_notification_config(
                        TaskPushNotificationConfig(task_id=r.task.id, url=hook.url)
                    )
                    hook.arrival.clear()
                    start = time.perf_counter()
                    await workspaces.publish(
                        WORKSPACE, [Completed(correlation_id=r.task.id)], producer="bob"
                    )
                    async with asyncio.timeout(10):
                        await hook.arrival.wait()
                    samples.append((time.perf_counter() - start) * 1000)
            await workspaces.aclose()
    return {f"push: completed → webhook p50 (ms, {n} tasks)": statistics.median(samples)}


async def reads(args: argparse.Namespace) -> None:
    figures = await push_latency(args)
    figures.update(await history_reads(args))
    figures.update(await hub_under_reads(args))
    print("A2A push and reads")
    for label, value in figures.items():
        print(f"{label:<48}{value:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and updates")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    parser.add_argument("--reads-only", action="store_true", help="only the read measures")
    args = parser.parse_args()
    if not args.reads_only:
        asyncio.run(run(args))
    asyncio.run(reads(args))


if __name__ == "__main__":
    main()
