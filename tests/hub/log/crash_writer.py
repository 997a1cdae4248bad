"""The child process of the crash test: appends under load until it is killed.

``python -m tests.hub.log.crash_writer DBPATH [TASKS] [WORKSPACES]``

Prints ``ready`` once the store is open, then one ``workspace seq id`` line per event, only
after ``append`` returned (the event is acknowledged, so it must survive anything). Each
batch's lines go out in ONE ``write(2)`` to the pipe (atomic below PIPE_BUF), so a SIGKILL
never leaves half a line that could be mistaken for an acknowledgement.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import uuid
from pathlib import Path

from hub.core.events import MessagePayload, MessagePosted, NeedWork
from hub.log.sqlite import SqliteEventStore


def _draft(rng: random.Random) -> MessagePosted | NeedWork:
    # Half of the events carry a client id, half get one minted by the store.
    event_id = uuid.uuid4().hex if rng.random() < 0.5 else ""
    if rng.random() < 0.7:
        return MessagePosted(
            id=event_id, producer="crash", payload=MessagePayload(text="x" * rng.randint(1, 300))
        )
    return NeedWork(id=event_id, producer="crash", payload={"n": rng.randint(0, 10**9)})


async def _worker(store: SqliteEventStore, workspace: str, seed: int) -> None:
    rng = random.Random(seed)
    while True:
        drafts = [_draft(rng) for _ in range(rng.randint(1, 3))]
        result = await store.append(workspace, drafts)
        lines = "".join(f"{workspace} {e.seq} {e.id}\n" for e in result.events)
        os.write(1, lines.encode())


async def _main(db: Path, tasks: int, workspaces: int) -> None:
    async with SqliteEventStore(db) as store:
        os.write(1, b"ready\n")
        async with asyncio.TaskGroup() as group:
            for k in range(tasks):
                group.create_task(_worker(store, f"crash-{k % workspaces}", os.getpid() * 100 + k))


def main(argv: list[str]) -> None:
    db = Path(argv[0])
    tasks = int(argv[1]) if len(argv) > 1 else 32
    workspaces = int(argv[2]) if len(argv) > 2 else 4
    asyncio.run(_main(db, tasks, workspaces))


if __name__ == "__main__":
    main(sys.argv[1:])
