"""``agora verify`` and replay against a long log: µs per event, beside a floor.

    python bench/verify_bench.py [--events 1000000] [--runs 3] [--keep DIR] [--only ROWS]

Builds (once; ``--keep DIR`` reuses it) a SQLite data directory holding ONE workspace of
``--events`` events, written with the store API directly in batches of 1,000 (as
bench/startup_bench.py builds its directories): a member that joins and leaves, one finished
execution, one file written as a blob (so verify has a blob to check) and otherwise
``messagePosted`` events of ~60 bytes of text. A snapshot of the workspace state is saved
5,000 events before the head, as a serving hub leaves one, so verify also compares the
snapshot-based state with a rebuild from scratch.

Rows (median of ``--runs``; the machine is shared, so read ratios more than absolute figures):

* ``floor``     — a bare loop in this process: sqlite3 ``fetchmany`` of every body in seq
  order and ``hashlib.sha256`` of each. No decoding: the least any verify must do.
* ``verify``    — ``agora verify WORKSPACE`` as a subprocess (hash chain, snapshot vs
  rebuild, referenced blobs), with its default ``--jobs`` (the usable CPUs: the chain
  checked in ranges by worker processes while the parent folds).
* ``verify-j1`` — ``agora verify --jobs 1 WORKSPACE``: all of it in one process.
* ``replay``    — ``agora replay WORKSPACE`` as a subprocess, its output to /dev/null.
* ``replay-json`` — ``agora replay --json WORKSPACE`` (the stored bytes, no decoding).
* ``fold``      — in this process: :func:`hub.log.loading.rebuild_state` (store read + decode
  + the workspace fold).

Each row prints wall seconds, CPU seconds (the child's user+sys for subprocesses), µs per
event of wall time, events/s and the ratio to the floor's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hub.core.events import (  # noqa: E402
    Event,
    ExecFinished,
    ExecFinishedPayload,
    ExecRequested,
    ExecRequestedPayload,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePayload,
    MessagePosted,
)
from hub.core.projections.snapshots import to_snapshot  # noqa: E402
from hub.log.factory import open_store  # noqa: E402
from hub.log.loading import rebuild_state  # noqa: E402

WORKSPACE = "bench"
BATCH = 1000
SNAPSHOT_BEFORE_HEAD = 5000
ROWS = ("floor", "verify", "verify-j1", "replay", "replay-json", "fold")


def _drafts(start: int, count: int, blob: str, blob_size: int) -> list[Event]:
    out: list[Event] = []
    for i in range(start, start + count):
        if i == 0:
            out.append(MemberJoined(payload=MemberPayload(agent="ann"), producer="ann"))
        elif i == 1:
            out.append(
                ExecRequested(
                    payload=ExecRequestedPayload(exec_id="e1", backend="process", source="true"),
                    producer="ann",
                )
            )
        elif i == 2:
            out.append(
                ExecFinished(
                    payload=ExecFinishedPayload(exec_id="e1", status="completed", reason="exit"),
                    producer="ann",
                )
            )
        elif i == 3:
            out.append(
                FileWritten(
                    payload=FileWrittenPayload(
                        path="data.bin", blob=blob, sha256=blob, size=blob_size
                    ),
                    producer="ann",
                )
            )
        elif i == 4:
            out.append(
                MemberLeft(payload=MemberPayload(agent="ann", reason="closed"), producer="ann")
            )
        else:
            text = f"message {i:07d} of the long log, some words to make it realistic"
            out.append(MessagePosted(payload=MessagePayload(text=text), producer="ann"))
    return out


async def build(data: Path, events: int) -> float:
    """Write the data directory; seconds it took."""
    began = time.perf_counter()
    async with open_store(None, data) as store:
        content = os.urandom(256 * 1024)
        blob = await store.blobs.put(content)
        written = 0
        while written < events:
            count = min(BATCH, events - written)
            await store.append(WORKSPACE, _drafts(written, count, blob, len(content)))
            written += count
            if written == events - SNAPSHOT_BEFORE_HEAD:
                state = await rebuild_state(store, WORKSPACE)
                await store.save_snapshot(to_snapshot(state))
            if written % 100_000 == 0:
                print(f"# built {written:,} events", flush=True)
    return time.perf_counter() - began


def _database(data: Path) -> Path:
    found = sorted(data.glob("*.db"))
    if not found:
        raise SystemExit(f"no database in {data}")
    return found[0]


def floor(data: Path) -> int:
    """sqlite3 fetch + sha256 of every body, in seq order; the number of rows."""
    conn = sqlite3.connect(f"file:{_database(data)}?mode=ro", uri=True)
    try:
        cur = conn.execute("SELECT body FROM events WHERE workspace = ? ORDER BY seq", (WORKSPACE,))
        sha = hashlib.sha256
        count = 0
        while rows := cur.fetchmany(5000):
            for (body,) in rows:
                sha(body).digest()
            count += len(rows)
        return count
    finally:
        conn.close()


def fold(data: Path) -> int:
    async def go() -> int:
        async with open_store(None, data) as store:
            return (await rebuild_state(store, WORKSPACE)).seq

    return asyncio.run(go())


def cli(data: Path, *argv: str) -> Callable[[], int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run() -> int:
        command = [sys.executable, "-m", "hub", *argv, "--data", str(data)]
        done = subprocess.run(
            command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr!r}")
        return 0

    return run


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    return time.process_time()


def measure(fn: Callable[[], int], runs: int, child: bool) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of ``runs`` calls."""
    walls: list[float] = []
    cpus: list[float] = []
    cpu = _child_cpu if child else _self_cpu
    for _ in range(runs):
        c0, t0 = cpu(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu() - c0)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build (or reuse) the data directory here")
    parser.add_argument("--only", default=",".join(ROWS), help=f"comma-separated: {ROWS}")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="agora-verify-bench-"))
    data = root / f"e{args.events}"
    try:
        if not any(data.glob("*.db")):
            took = asyncio.run(build(data, args.events))
            print(f"# built {args.events:,} events in {took:.1f} s", flush=True)
        jobs: dict[str, tuple[Callable[[], int], bool]] = {
            "floor": (lambda: floor(data), False),
            "verify": (cli(data, "verify", WORKSPACE), True),
            "verify-j1": (cli(data, "verify", "--jobs", "1", WORKSPACE), True),
            "replay": (cli(data, "replay", WORKSPACE), True),
            "replay-json": (cli(data, "replay", "--json", WORKSPACE), True),
            "fold": (lambda: fold(data), False),
        }
        wanted = [r for r in args.only.split(",") if r]
        for row in wanted:
            if row not in jobs:
                raise SystemExit(f"unknown row {row!r}; rows: {', '.join(ROWS)}")
        print(f"# {args.events:,} events, median of {args.runs}; shared machine, noisy")
        head = f"{'row':<12} {'wall s':>8} {'cpu s':>8} {'µs/event':>9} {'events/s':>11}"
        print(f"{head} {'/floor':>7}")
        # The floor is measured first whatever is asked: every row is compared with it.
        floor_wall, floor_cpu = measure(jobs["floor"][0], args.runs, False)
        for row in wanted:
            fn, child = jobs[row]
            wall, cpu = (floor_wall, floor_cpu) if row == "floor" else measure(fn, args.runs, child)
            print(
                f"{row:<12} {wall:>8.2f} {cpu:>8.2f} {wall / args.events * 1e6:>9.2f} "
                f"{args.events / wall:>11,.0f} {wall / floor_wall:>6.1f}x",
                flush=True,
            )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
