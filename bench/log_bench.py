"""Log store benchmark: Agora's SQLite store side by side with the ``eventsourcing`` library.

    python bench/log_bench.py [--events N] [--replay-events M] [--repeats R] [--quick] [--dir D]

Both run on the same disk with the same durability (SQLite WAL, ``synchronous=FULL``: every
acknowledged append is fsynced) and the same event (a ~200-byte text payload). Measured:

(a) durable appends/s, 1 writer: N/4 appends of one event, each awaited before the next.
    eventsourcing's ``put`` is synchronous: the first row calls it directly (no thread hop
    at all), the second through ``asyncio.to_thread``, as an asyncio hub would have to (a
    blocking call on the event loop stalls every connection). Agora pays two thread hand-offs
    per append (loop → writer thread → loop), so on a lone writer it can only approach the
    direct call; the fsync per append dominates both.
(b) durable appends/s, 64 concurrent writers, N appends in all. Agora: the writers share 8
    workspaces (8 agents per workspace, Agora's model; the store assigns seqs, so they never
    conflict), and a second row gives each writer its own workspace. eventsourcing: each
    thread appends to its own aggregate (writers sharing an aggregate would conflict on
    versions and have to retry, which would only slow it down). That row compares group
    commit against one transaction per call; the row "vs es with group commit" gives
    eventsourcing the same asyncio group commit Agora has (64 asyncio writers, one writer
    task ``put``-ting each drained batch in one transaction), which compares the stores.
(c) replay events/s over M events of one workspace / aggregate: read + decode + a trivial fold
    (count of events per kind, last seq).
(d) Agora alone: (b)'s 64-writer appends/s with each workspace's Merkle tree and signed
    checkpoints on (the default: stored hashes written in every commit, a
    :class:`hub.checkpoints.Checkpointer` told of every append as the server tells it,
    signing at its default every-1000-events / 10 s) beside the same run with both off
    (``SqliteEventStore(merkle=False)``, no checkpointer); runs interleaved, same process.
    Target: on within 10% of off. ``--tree-only`` runs just this.

The eventsourcing side (9.x) is its persistence layer without the aggregate machinery, the
closest equivalent of an :class:`EventStore`: ``eventsourcing.persistence.EventStore`` with
its JSON ``Mapper`` over ``SQLiteApplicationRecorder`` (which also keeps a global order, like
our ``position``). Its library sets WAL itself; we additionally set ``synchronous=FULL`` on every
connection its pool opens (SQLite's default for WAL is FULL as well; we check it). It has no
asyncio API for SQLite, so (b) uses 64 threads, each with its own aggregate; its pool lets
one writer at a time in and each ``put`` is its own transaction. Each side builds its event
objects inside the timed loop (the client's share of an append).

Agora's ids: minted by the store (drafts without ids) unless a row says "client uuid4 ids".
The medians of ``--repeats`` runs are printed (fresh database per append run); ratio =
Agora / eventsourcing. Use a directory on a real disk (not tmpfs) so fsync means something.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eventsourcing.domain import DomainEvent
from eventsourcing.persistence import (
    DatetimeAsISO,
    EventStore,
    JSONTranscoder,
    Mapper,
    UUIDAsHex,
)
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

from hub.checkpoints import Checkpointer
from hub.core.checkpoint import generate_signer
from hub.core.events import MessagePayload, MessagePosted
from hub.core.merkle import accelerated
from hub.log.sqlite import SqliteEventStore

TEXT = ("Agora bench payload: the quick brown fox jumps over the lazy dog. " * 4)[:200]
WRITERS = 64
TARGETS = {
    "single": 3_500.0,
    "concurrent": 50_000.0,
    "concurrent_gc": 50_000.0,
    "replay": 500_000.0,
}
# (a) has no ratio target: with one writer awaiting each append, both sides must pay one
# fsync per append, so the ratio can only approach 1x.
# concurrent_gc: eventsourcing given the same group commit; no ratio target (the honest
# figure: what the store itself adds or costs, issue 16).
RATIO_TARGETS = {"single": 0.0, "concurrent": 2.0, "concurrent_gc": 0.0, "replay": 2.0}
TREE_RATIO_TARGET = 0.9  # (d): appends/s with the tree and checkpoints on / off


# -- eventsourcing side ---------------------------------------------------------------------


class Posted(DomainEvent):
    """The eventsourcing event: same payload as Agora's messagePosted."""

    text: str


def es_open(db: Path) -> tuple[EventStore[Any], SQLiteDatastore]:
    transcoder = JSONTranscoder()
    transcoder.register(UUIDAsHex())
    transcoder.register(DatetimeAsISO())
    datastore = SQLiteDatastore(str(db), pool_size=WRITERS + 2)
    pool = datastore.pool
    create = pool._create_connection

    def create_full_sync() -> Any:
        conn = create()
        conn._sqlite_conn.execute("PRAGMA synchronous=FULL")
        return conn

    pool._create_connection = create_full_sync  # type: ignore[method-assign]
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    with datastore.transaction(commit=False) as c:
        c.execute("PRAGMA journal_mode")
        mode = c.fetchone()[0]
        c.execute("PRAGMA synchronous")
        sync = c.fetchone()[0]
    assert (str(mode).lower(), sync) == ("wal", 2), (mode, sync)
    return EventStore(Mapper(transcoder), recorder), datastore


def es_single(db: Path, n: int) -> float:
    store, datastore = es_open(db)
    oid = uuid.uuid4()
    try:
        t0 = time.perf_counter()
        for version in range(1, n + 1):
            store.put(
                [
                    Posted(
                        originator_id=oid,
                        originator_version=version,
                        timestamp=Posted.create_timestamp(),
                        text=TEXT,
                    )
                ]
            )
        return n / (time.perf_counter() - t0)
    finally:
        datastore.close()


async def es_single_from_asyncio(db: Path, n: int) -> float:
    """(a) as an asyncio hub would have to call it: ``put`` blocks, so via a thread."""
    store, datastore = es_open(db)
    oid = uuid.uuid4()
    try:
        t0 = time.perf_counter()
        for version in range(1, n + 1):
            event = Posted(
                originator_id=oid,
                originator_version=version,
                timestamp=Posted.create_timestamp(),
                text=TEXT,
            )
            await asyncio.to_thread(store.put, [event])
        return n / (time.perf_counter() - t0)
    finally:
        datastore.close()


def es_concurrent(db: Path, n: int) -> float:
    store, datastore = es_open(db)
    per_writer = n // WRITERS
    start = threading.Barrier(WRITERS + 1)
    errors: list[BaseException] = []

    def writer() -> None:
        oid = uuid.uuid4()
        start.wait()
        try:
            for version in range(1, per_writer + 1):
                store.put(
                    [
                        Posted(
                            originator_id=oid,
                            originator_version=version,
                            timestamp=Posted.create_timestamp(),
                            text=TEXT,
                        )
                    ]
                )
        except BaseException as e:  # reported after the run
            errors.append(e)

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    try:
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    finally:
        datastore.close()
    if errors:
        raise errors[0]
    return per_writer * WRITERS / elapsed


async def es_group_commit(db: Path, n: int, batch_max: int = 256) -> float:
    """(b) for eventsourcing with the group commit Agora has: 64 asyncio writers (each its
    own aggregate) queue their events; one writer task drains the queue and ``put``s the
    whole batch (one transaction, one fsync) on one thread, then wakes each caller. The same
    shape as hub.log.writer.GroupCommit, so the ratio compares the stores, not the
    batching."""
    store, datastore = es_open(db)
    per_writer = n // WRITERS
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Posted, asyncio.Future[None]]] = asyncio.Queue()
    executor = concurrent.futures.ThreadPoolExecutor(1)

    async def commit_loop() -> None:
        while True:
            batch = [await queue.get()]
            while len(batch) < batch_max and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                await loop.run_in_executor(executor, store.put, [e for e, _ in batch])
            except Exception as e:
                for _, fut in batch:
                    fut.set_exception(e)
            else:
                for _, fut in batch:
                    fut.set_result(None)

    async def writer() -> None:
        oid = uuid.uuid4()
        for version in range(1, per_writer + 1):
            event = Posted(
                originator_id=oid,
                originator_version=version,
                timestamp=Posted.create_timestamp(),
                text=TEXT,
            )
            done = loop.create_future()
            queue.put_nowait((event, done))
            await done

    committer = asyncio.create_task(commit_loop())
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(writer() for _ in range(WRITERS)))
        return per_writer * WRITERS / (time.perf_counter() - t0)
    finally:
        committer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await committer
        executor.shutdown()
        datastore.close()


def es_replay(db: Path, m: int, repeats: int) -> list[float]:
    store, datastore = es_open(db)
    oid = uuid.uuid4()
    try:
        stamp = Posted.create_timestamp()
        for start in range(1, m + 1, 1000):
            store.put(
                [
                    Posted(originator_id=oid, originator_version=v, timestamp=stamp, text=TEXT)
                    for v in range(start, min(start + 1000, m + 1))
                ]
            )
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            kinds: Counter[type] = Counter()
            last = 0
            while True:
                page = list(store.get(oid, gt=last, limit=5000))
                for ev in page:
                    kinds[type(ev)] += 1
                    last = ev.originator_version
                if len(page) < 5000:
                    break
            elapsed = time.perf_counter() - t0
            assert last == m and sum(kinds.values()) == m
            rates.append(m / elapsed)
        return rates
    finally:
        datastore.close()


# -- Agora side -----------------------------------------------------------------------------


def draft(client_id: bool = False) -> MessagePosted:
    return MessagePosted(
        id=str(uuid.uuid4()) if client_id else "",
        producer="bench",
        payload=MessagePayload(text=TEXT),
    )


async def agora_single(db: Path, n: int) -> float:
    async with SqliteEventStore(db) as store:
        t0 = time.perf_counter()
        for _ in range(n):
            await store.append("bench", [draft()])
        return n / (time.perf_counter() - t0)


async def agora_concurrent(
    db: Path, n: int, *, workspaces: int = 8, client_ids: bool = False
) -> float:
    per_writer = n // WRITERS
    async with SqliteEventStore(db) as store:

        async def writer(k: int) -> None:
            workspace = f"bench-{k % workspaces}"
            for _ in range(per_writer):
                await store.append(workspace, [draft(client_ids)])

        t0 = time.perf_counter()
        await asyncio.gather(*(writer(k) for k in range(WRITERS)))
        return per_writer * WRITERS / (time.perf_counter() - t0)


def written_bytes() -> int:
    """Bytes this process has handed to write() so far (Linux ``/proc/self/io`` ``wchar``;
    0 elsewhere): the WAL frames and checkpoint copies of the store."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        lines = Path("/proc/self/io").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("wchar:")).split()[1])
    return 0


async def agora_tree(
    db: Path, n: int, *, on: bool, workspaces: int = 8
) -> tuple[float, float, int, float]:
    """(d): (b) with the Merkle tree and checkpoints on or off; (appends/s, CPU µs of this
    process per append, checkpoints signed, bytes written per append). CPU time and bytes
    written are less at the mercy of other processes on a shared machine than the rate is."""
    per_writer = n // WRITERS
    async with SqliteEventStore(db, merkle=on) as store:
        checkpoints = Checkpointer(store, generate_signer("agora.bench")) if on else None

        async def writer(k: int) -> None:
            workspace = f"bench-{k % workspaces}"
            for _ in range(per_writer):
                result = await store.append(workspace, [draft()])
                if checkpoints is not None:
                    checkpoints.appended(workspace, result.events[-1].seq)  # as the server

        total = per_writer * WRITERS
        if checkpoints is None:
            t0, c0, w0 = time.perf_counter(), time.process_time(), written_bytes()
            await asyncio.gather(*(writer(k) for k in range(WRITERS)))
            cpu = (time.process_time() - c0) / total * 1e6
            wrote = (written_bytes() - w0) / total
            return total / (time.perf_counter() - t0), cpu, 0, wrote
        async with checkpoints:
            t0, c0, w0 = time.perf_counter(), time.process_time(), written_bytes()
            await asyncio.gather(*(writer(k) for k in range(WRITERS)))
            rate = total / (time.perf_counter() - t0)
            cpu = (time.process_time() - c0) / total * 1e6
            wrote = (written_bytes() - w0) / total
        made = 0
        for w in range(workspaces):
            made += len(await store.list_checkpoints(f"bench-{w}"))
        return rate, cpu, made, wrote


def tree_rows(root: Path, n: int, repeats: int) -> None:
    """(d): interleaved off/on runs; prints the medians and the ratio."""
    off: list[float] = []
    on: list[float] = []
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wrote: dict[bool, list[float]] = {False: [], True: []}
    signed: list[int] = []
    for i in range(repeats):
        for flag, rates in ((False, off), (True, on)):
            run_dir = root / f"d-{flag}-{i}"
            run_dir.mkdir()
            rate, used, made, written = asyncio.run(agora_tree(run_dir / "log.db", n, on=flag))
            rates.append(rate)
            cpu[flag].append(used)
            wrote[flag].append(written)
            if flag:
                signed.append(made)
            shutil.rmtree(run_dir)
    m_off, m_on = statistics.median(off), statistics.median(on)
    ratio = m_on / m_off
    mark = "ok" if ratio >= TREE_RATIO_TARGET else "MISS"
    print(f"(d) {n} appends by {WRITERS} writers, Merkle tree + checkpoints; median of {repeats}")
    print(
        f"    off {fmt(m_off)} appends/s | on {fmt(m_on)} appends/s | on/off {ratio:.2f}  "
        f"target >= {TREE_RATIO_TARGET:g}  {mark}"
    )
    # Each on run beside the off run just before it: the machine's drift over the runs
    # cancels in each pair, so the spread of these says how far to trust the ratio above.
    paired = sorted(a / b for a, b in zip(on, off, strict=True))
    print(
        f"    on/off per pair of runs: median {statistics.median(paired):.2f} "
        f"(range {paired[0]:.2f}-{paired[-1]:.2f})"
    )
    c_off, c_on = statistics.median(cpu[False]), statistics.median(cpu[True])
    print(f"    CPU per append: off {c_off:.1f} µs | on {c_on:.1f} µs | on/off {c_on / c_off:.2f}")
    w_off, w_on = statistics.median(wrote[False]), statistics.median(wrote[True])
    if w_off:
        print(
            f"    written per append (WAL + checkpoint copies): off {w_off:,.0f} B | "
            f"on {w_on:,.0f} B | on/off {w_on / w_off:.2f}"
        )
    print(f"    runs off: {', '.join(fmt(r) for r in off)}")
    print(
        f"    runs on:  {', '.join(fmt(r) for r in on)} (checkpoints signed: "
        f"{', '.join(map(str, signed))})"
    )


async def agora_replay(db: Path, m: int, repeats: int) -> list[float]:
    async with SqliteEventStore(db) as store:
        for start in range(0, m, 1000):
            await store.append("replay", [draft() for _ in range(min(1000, m - start))])
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            kinds: Counter[str] = Counter()
            last = 0
            async for ev in store.read("replay"):
                kinds[ev.kind] += 1
                last = ev.seq
            elapsed = time.perf_counter() - t0
            assert last == m and sum(kinds.values()) == m
            rates.append(m / elapsed)
        return rates


# -- driver ---------------------------------------------------------------------------------


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "?"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def repeat(fn: Callable[[Path], float], root: Path, label: str, repeats: int) -> list[float]:
    rates = []
    for i in range(repeats):
        run_dir = root / f"{label}-{i}"
        run_dir.mkdir()
        rates.append(fn(run_dir / "log.db"))
        shutil.rmtree(run_dir)
    return rates


def fmt(rate: float) -> str:
    return f"{rate:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="appends in (b); (a) N/4")
    parser.add_argument("--replay-events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go")
    parser.add_argument("--tree-only", action="store_true", help="run only (d)")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.replay_events = 3_200, 50_000
    repeats = max(3, args.repeats)
    n_single = max(1, args.events // 4)
    n_conc = max(WRITERS, args.events)
    base = args.dir or Path(tempfile.gettempdir())
    if fs_type(base) in {"tmpfs", "ramfs"}:
        base = Path(__file__).resolve().parent
    root = Path(tempfile.mkdtemp(prefix="log-bench-", dir=base))
    if args.tree_only:
        try:
            print(
                f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
                f"{os.cpu_count()} CPUs, databases in {root} ({fs_type(root)}); "
                f"Merkle hashing in {'C' if accelerated() else 'Python'}"
            )
            tree_rows(root, n_conc, repeats)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    try:
        print(
            f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
            f"eventsourcing {_es_version()}, {os.cpu_count()} CPUs, "
            f"databases in {root} ({fs_type(root)}); WAL + synchronous=FULL on both sides; "
            f"Merkle hashing in {'C' if accelerated() else 'Python'}"
        )
        print(
            f"(a) {n_single} appends, (b) {n_conc} appends by {WRITERS} writers, "
            f"(c) replay of {args.replay_events} events; median of {repeats} runs\n"
        )
        rows: list[tuple[str, str, list[float], list[float] | None]] = []

        a_ag = repeat(lambda p: asyncio.run(agora_single(p, n_single)), root, "a-ag", repeats)
        a_es = repeat(lambda p: es_single(p, n_single), root, "a-es", repeats)
        rows.append(("(a) appends/s, 1 writer", "single", a_ag, a_es))
        a_es_async = repeat(
            lambda p: asyncio.run(es_single_from_asyncio(p, n_single)), root, "a-esa", repeats
        )
        rows.append(("    vs es called via to_thread", "single", a_ag, a_es_async))

        b_ag = repeat(lambda p: asyncio.run(agora_concurrent(p, n_conc)), root, "b-ag", repeats)
        b_es = repeat(lambda p: es_concurrent(p, n_conc), root, "b-es", repeats)
        rows.append((f"(b) appends/s, {WRITERS} writers", "concurrent", b_ag, b_es))
        b_es_gc = repeat(lambda p: asyncio.run(es_group_commit(p, n_conc)), root, "b-esgc", repeats)
        rows.append(("    vs es with group commit", "concurrent_gc", b_ag, b_es_gc))
        b_own = repeat(
            lambda p: asyncio.run(agora_concurrent(p, n_conc, workspaces=WRITERS)),
            root,
            "b-own",
            repeats,
        )
        rows.append(("    one workspace per writer", "concurrent", b_own, b_es))
        b_ids = repeat(
            lambda p: asyncio.run(agora_concurrent(p, n_conc, client_ids=True)),
            root,
            "b-ids",
            repeats,
        )
        rows.append(("    client uuid4 ids", "concurrent", b_ids, b_es))

        (root / "c-ag").mkdir()
        (root / "c-es").mkdir()
        c_ag = asyncio.run(agora_replay(root / "c-ag" / "log.db", args.replay_events, repeats))
        c_es = es_replay(root / "c-es" / "log.db", args.replay_events, repeats)
        rows.append(("(c) replay events/s", "replay", c_ag, c_es))

        header = f"{'metric':<34}{'agora':>12}{'eventsourcing':>15}{'ratio':>8}  {'target':<16}"
        print(header)
        print("-" * len(header))
        for label, target_key, ours, theirs in rows:
            m_ours = statistics.median(ours)
            m_theirs = statistics.median(theirs) if theirs else float("nan")
            target = TARGETS[target_key]
            ratio_ok = m_ours >= RATIO_TARGETS[target_key] * m_theirs
            mark = "ok" if m_ours >= target and ratio_ok else "MISS"
            ratio_target = RATIO_TARGETS[target_key]
            wanted = fmt(target) + (f" & >={ratio_target:g}x" if ratio_target else "")
            print(
                f"{label:<34}{fmt(m_ours):>12}{fmt(m_theirs):>15}"
                f"{m_ours / m_theirs:>7.1f}x  {wanted:<16}{mark}"
            )
        print("\nruns (agora | eventsourcing):")
        for label, _, ours, theirs in rows:
            print(
                f"  {label.strip():<32} {', '.join(fmt(r) for r in ours)} | "
                f"{', '.join(fmt(r) for r in theirs or [])}"
            )
        print()
        tree_rows(root, n_conc, repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _es_version() -> str:
    from importlib.metadata import version

    return version("eventsourcing")


if __name__ == "__main__":
    sys.exit(main())
