"""Appends/s of the two event stores side by side: PostgreSQL (one and two store instances,
i.e. hub nodes, on one database) and SQLite, with 1 and 64 concurrent writers.

    python bench/store_bench.py [--seconds 3] [--repeats 3] [--dsn postgresql://…]

One 100-byte message per append, 8 workspaces, durable commits on both (PostgreSQL's default
``synchronous_commit=on``; SQLite WAL + ``synchronous=FULL``). Prints the median of the
repeats. A measurement, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from hub.core.events import MessagePayload, MessagePosted
from hub.log.base import EventStore
from hub.log.postgres import PostgresEventStore
from hub.log.sqlite import SqliteEventStore

DSN = "postgresql://postgres@127.0.0.1:5432/test"


async def rate(stores: list[EventStore], writers: int, seconds: float) -> float:
    """Appends/s of ``writers`` tasks spread over ``stores`` for ``seconds``."""
    count = 0
    deadline = time.perf_counter() + seconds

    async def writer(k: int) -> None:
        nonlocal count
        store = stores[k % len(stores)]
        while time.perf_counter() < deadline:
            draft = MessagePosted(payload=MessagePayload(text="x" * 100))
            await store.append(f"bench{k % 8}", [draft])
            count += 1

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for k in range(writers):
            tg.create_task(writer(k))
    return count / (time.perf_counter() - start)


async def run(dsn: str, seconds: float, repeats: int, workdir: Path) -> list[tuple[str, float]]:
    results: dict[str, list[float]] = {}
    for r in range(repeats):
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        try:
            async with (
                PostgresEventStore(dsn, schema=schema) as pg,
                PostgresEventStore(dsn, schema=schema) as pg2,
            ):
                for writers in (1, 64):
                    key = f"postgres 1 node,  {writers:>2} writer(s)"
                    results.setdefault(key, []).append(await rate([pg], writers, seconds))
                key = "postgres 2 nodes, 64 writer(s)"
                results.setdefault(key, []).append(await rate([pg, pg2], 64, seconds))
        finally:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await conn.close()
        async with SqliteEventStore(workdir / f"bench{r}.db") as lite:
            for writers in (1, 64):
                key = f"sqlite            {writers:>2} writer(s)"
                results.setdefault(key, []).append(await rate([lite], writers, seconds))
    return [(k, statistics.median(v)) for k, v in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # The real disk, not tmpfs: SQLite's fsync must cost what it costs.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        rows = asyncio.run(run(args.dsn, args.seconds, args.repeats, Path(tmp)))
    print(f"appends/s, median of {args.repeats} x {args.seconds:g} s")
    for name, value in rows:
        print(f"{name}: {value:9.0f}")


if __name__ == "__main__":
    main()
