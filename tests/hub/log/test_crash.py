"""Durability under SIGKILL: no acknowledged event is ever lost, and the log stays sound.

A child process (``tests/hub/log/crash_writer.py``) appends under load (32 concurrent tasks,
4 workspaces) and prints every acknowledged event; we SIGKILL it at random moments, several
times over the same database, and after every kill reopen the database and check that every
acknowledged event is there with its id, that seqs are gapless and every chain verifies.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from pathlib import Path

import pytest

from hub.log.sqlite import SqliteEventStore

REPO_ROOT = Path(__file__).resolve().parents[3]
TRIALS = 6


async def _run_and_kill(db: Path, rng: random.Random) -> dict[tuple[str, int], str]:
    """Start the writer, kill it at a random moment, return what it acknowledged."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.hub.log.crash_writer",
        str(db),
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    acked: dict[tuple[str, int], str] = {}
    try:
        async with asyncio.timeout(30):
            ready = await proc.stdout.readline()
        assert ready == b"ready\n", ready

        async def collect() -> None:
            assert proc.stdout is not None
            while line := await proc.stdout.readline():
                if not line.endswith(b"\n"):
                    break  # cannot happen (one write per batch), but never trust half a line
                workspace, seq, event_id = line.decode().split()
                acked[(workspace, int(seq))] = event_id

        reader = asyncio.create_task(collect())
        await asyncio.sleep(rng.uniform(0.05, 1.2))
        proc.kill()  # SIGKILL: no cleanup, no flush, no close
        await proc.wait()
        async with asyncio.timeout(30):
            await reader
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return acked


async def _check(db: Path, acked: dict[tuple[str, int], str]) -> int:
    async with SqliteEventStore(db) as store:
        stored: dict[tuple[str, int], str] = {}
        for head in await store.heads():
            seqs = []
            async for ev in store.read(head.workspace):
                stored[(ev.workspace, ev.seq)] = ev.id
                seqs.append(ev.seq)
            assert seqs == list(range(1, head.seq + 1)), f"gap in {head.workspace}"
            report = await store.verify(head.workspace)
            assert report.ok, report
        lost = {k: v for k, v in acked.items() if stored.get(k) != v}
        assert not lost, (
            f"{len(lost)} acknowledged events lost or changed, e.g. {next(iter(lost.items()))}"
        )
        return len(stored)


@pytest.mark.slow
async def test_sigkill_never_loses_an_acknowledged_event(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    db = tmp_path / "crash.db"
    acked: dict[tuple[str, int], str] = {}
    total = 0
    for trial in range(TRIALS):
        got = await _run_and_kill(db, rng)
        # An acknowledged (workspace, seq) never changes its id from one run to the next.
        for key, event_id in got.items():
            assert acked.setdefault(key, event_id) == event_id, (seed, trial, key)
        total = await _check(db, acked)
        assert total >= len(acked)
    assert acked, f"the writer never acknowledged anything (seed {seed})"
    print(f"crash test: seed {seed}, {TRIALS} kills, {len(acked)} acknowledged, {total} stored")
