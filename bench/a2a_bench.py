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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
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
    TaskState,
)
from google.protobuf import json_format  # noqa: E402

from a2a_adapter.app import A2AService  # noqa: E402
from hub.auth import TokenSigner  # noqa: E402
from hub.config import HubConfig  # noqa: E402
from hub.core.events import Completed, NeedWork, WorkClaimed, WorkPublished  # noqa: E402
from hub.follow import LogFollower  # noqa: E402
from hub.log.sqlite import SqliteEventStore  # noqa: E402
from hub.workspaces import Workspaces  # noqa: E402
from tests.a2a_adapter.echo_agent import echo_agent  # noqa: E402

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
            async with A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=0) as svc:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and updates")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
