"""Work-item claims on one node while another node floods the same workspace with messages.

    python bench/flood_bench.py [--store postgresql://…] [--claims 200] [--flooders 8] [--repeats 3]

Two nodes in one process, as two :class:`hub.workspaces.Workspaces` over two
:class:`hub.log.postgres.PostgresEventStore` on one schema (each its own pool and writer, as
two ``agora serve`` processes would have): node B's ``--flooders`` publishers post messages
to workspace ``w`` in closed loops, as fast as their acks come; node A opens and claims
``--claims`` work items there, one after the other (``needWork``, then ``workClaimed``), and
hears of B's events every 2 ms (``Workspaces.catch_up``, what its follower does on NOTIFY).
A claim is decided on A's state, which never has B's latest messages: the store's check of
``reads`` (hub.core.rules.decide.kinds_read) appends it after them. ``strict`` runs the same
with that check off (every batch decided on the state must land right after the head it was
decided on, the behaviour before it): such a claim is refused when B appended meanwhile and
decided again, up to ``MAX_REDECIDE`` times before the publish answers ``conflict``.

Printed per mode, medians of ``--repeats`` alternated runs: publishes of A refused with
``conflict``, redecisions per publish (store refusals of a moved head), and B's message rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub import workspaces as workspaces_module
from hub.core.errors import Conflict
from hub.core.events import Event, MessagePayload, MessagePosted, NeedWork, WorkClaimed
from hub.core.records import AppendResult
from hub.log.base import AppendItem
from hub.log.postgres import PostgresEventStore
from hub.workspaces import Workspaces

DSN = os.environ.get("AGORA_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


class _Counting(PostgresEventStore):
    """Counts the appends the store refused because the head had moved (a redecision)."""

    moved = 0

    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        expected_seq: int | None = None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        try:
            return await super().append(workspace, drafts, expected_seq=expected_seq, reads=reads)
        except Conflict as e:
            if "head" in e.details:
                self.moved += 1
            raise

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | Exception]:
        outcomes = await super().append_many(workspace, items)
        self.moved += sum(isinstance(o, Conflict) and "head" in o.details for o in outcomes)
        return outcomes


async def one_run(dsn: str, claims: int, flooders: int, strict: bool) -> tuple[float, float, float]:
    """(share of A's publishes refused, store refusals per publish of A, B's messages/s)."""
    schema = f"flood_{uuid.uuid4().hex[:12]}"
    saved = workspaces_module._tolerated
    if strict:
        workspaces_module._tolerated = lambda live, kinds, expected_seq: None
    try:
        async with (
            _Counting(dsn, schema=schema) as store_a,
            PostgresEventStore(dsn, schema=schema) as store_b,
        ):
            node_a, node_b = Workspaces(store_a), Workspaces(store_b)
            await node_a.publish(
                "w", [MessagePosted(payload=MessagePayload(text="open"))], producer="a"
            )
            stop = asyncio.Event()
            posted = 0

            async def flood(k: int) -> None:
                nonlocal posted
                while not stop.is_set():
                    text = f"flood {k}"
                    await node_b.publish(
                        "w", [MessagePosted(payload=MessagePayload(text=text))], producer="b"
                    )
                    posted += 1

            async def hear() -> None:
                while not stop.is_set():
                    await node_a.catch_up("w")
                    await asyncio.sleep(0.002)

            refused = 0
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(flood(k)) for k in range(flooders)]
                tasks.append(tg.create_task(hear()))
                await asyncio.sleep(0.2)  # the flood under way
                start, posted_before = time.perf_counter(), posted
                for i in range(claims):
                    for draft in (
                        NeedWork(correlation_id=f"c{i}"),
                        WorkClaimed(correlation_id=f"c{i}"),
                    ):
                        try:
                            await node_a.publish("w", [draft], producer="alice")
                        except Conflict:
                            refused += 1
                rate = (posted - posted_before) / (time.perf_counter() - start)
                stop.set()
            del tasks
            return refused / (2 * claims), store_a.moved / (2 * claims), rate
    finally:
        workspaces_module._tolerated = saved
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=DSN)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float, float]]] = {"reads": [], "strict": []}
    for _ in range(max(1, args.repeats)):
        for mode in results:
            results[mode].append(
                await one_run(args.store, args.claims, args.flooders, mode == "strict")
            )
    print(f"{args.claims} claims on node A, {args.flooders} flooders on node B", end="")
    print(f", median of {args.repeats}")
    for mode, runs in results.items():
        refused = statistics.median(r[0] for r in runs)
        moved = statistics.median(r[1] for r in runs)
        rate = statistics.median(r[2] for r in runs)
        print(
            f"  {mode:6s} refused {refused:6.1%} of A's publishes | {moved:5.2f} store refusals "
            f"per publish | B posts {rate:,.0f} messages/s"
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(asyncio.run(main()))
