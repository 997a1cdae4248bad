"""The child process of the fsync test: appends one event at a time and reports each
acknowledgement with one ``write(2)`` of ``ACK <seq>`` to stdout.

``python -m tests.hub.log.fsync_driver sqlite DBPATH COUNT`` or
``python -m tests.hub.log.fsync_driver postgres URL COUNT SCHEMA`` (the URL should carry an
``application_name``: the driver prints ``PIDS <pid> …``, the server processes of its
connections, found by that name).

Run under ``strace``, the test reads the system calls between two acknowledgements: a store
that acknowledges before its data is on disk shows none of ``fsync``/``fdatasync`` there.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from hub.core.events import MessagePayload, MessagePosted
from hub.log.base import EventStore
from hub.log.postgres import PostgresEventStore
from hub.log.sqlite import SqliteEventStore


def _store(kind: str, where: str, schema: str) -> EventStore:
    if kind == "sqlite":
        path = Path(where)
        return SqliteEventStore(path, blobs_dir=path.parent / "blobs")
    return PostgresEventStore(where, schema=schema)


async def _backend_pids(url: str) -> list[int]:
    import asyncpg  # only the PostgreSQL run needs it

    name = url.split("application_name=", 1)[1].split("&", 1)[0]
    conn = await asyncpg.connect(url.split("?", 1)[0])
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name
        )
    finally:
        await conn.close()
    return [r["pid"] for r in rows]


async def main(kind: str, where: str, count: int, schema: str) -> None:
    async with _store(kind, where, schema) as store:
        await store.append("fsync", [MessagePosted(producer="t", payload=MessagePayload())])
        if kind == "postgres":
            pids = await _backend_pids(where)
            os.write(1, ("PIDS " + " ".join(map(str, pids)) + "\n").encode())
        os.write(1, b"READY\n")
        for i in range(count):
            result = await store.append(
                "fsync", [MessagePosted(producer="t", payload=MessagePayload(text=f"m{i}"))]
            )
            os.write(1, f"ACK {result.events[0].seq}\n".encode())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), (sys.argv[4:] or ["agora"])[0]))
