"""Durability is tested, not assumed: every acknowledgement is preceded by an ``fdatasync`` (or
``fsync``) of the log's journal, seen under ``strace`` (issue 11).

A SIGKILL test cannot catch a store that acknowledges before its data is on disk (the OS page
cache survives a killed process), so these tests read the system calls instead: the driver
appends one event at a time and writes ``ACK <seq>`` after each acknowledgement; between two
acknowledgements there must be a sync of the SQLite WAL (or of PostgreSQL's ``pg_wal``, by the
server process of the store's own connection). With SQLite's ``synchronous=OFF`` (or
PostgreSQL's ``synchronous_commit=off``) the syncs vanish and the test fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.support.postgres import POSTGRES_DSN, postgres_unavailable
from tests.support.require import require

REPO = Path(__file__).resolve().parents[3]
COUNT = 12
_SYNC = re.compile(r"^(?P<pid>\d+) +(?P<t>[\d.]+) +f(?:data)?sync\((?P<fd>\d+)<(?P<path>[^>]*)>")
_ACK = re.compile(r'^(?:\d+ +)?(?P<t>[\d.]+) +write\(1(?:<[^>]*>)?, "ACK (?P<seq>\d+)')


def _strace() -> str:
    path = shutil.which("strace")
    require("strace", path is not None, "strace is not installed")
    assert path is not None
    return path


def _acks(trace: str) -> list[float]:
    return [float(m["t"]) for line in trace.splitlines() if (m := _ACK.match(line))]


def _syncs(trace: str, path_part: str, pids: set[int] | None = None) -> list[float]:
    out = []
    for line in trace.splitlines():
        m = _SYNC.match(line)
        if m and path_part in m["path"] and (pids is None or int(m["pid"]) in pids):
            out.append(float(m["t"]))
    return out


def _assert_synced_before_each_ack(acks: list[float], syncs: list[float]) -> None:
    assert len(acks) == COUNT, acks
    previous = 0.0
    for n, ack in enumerate(acks, start=1):
        between = [t for t in syncs if previous < t < ack]
        assert between, f"acknowledgement {n} was given with no sync of the log before it"
        previous = ack


def test_sqlite_syncs_the_wal_before_every_acknowledgement(tmp_path: Path) -> None:
    strace = _strace()
    trace = tmp_path / "trace.txt"
    db = tmp_path / "agora.db"
    argv = [strace, "-f", "-qq", "-ttt", "-y", "-e", "trace=fsync,fdatasync,write"]
    argv += ["-o", str(trace), sys.executable, "-m", "tests.hub.log.fsync_driver"]
    done = subprocess.run(
        [*argv, "sqlite", str(db), str(COUNT)], cwd=REPO, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    text = trace.read_text()
    _assert_synced_before_each_ack(_acks(text), _syncs(text, "agora.db-wal"))


def test_postgresql_syncs_its_wal_before_every_acknowledgement(tmp_path: Path) -> None:
    why = postgres_unavailable()
    require("postgres", why is None, why or "")
    strace = _strace()
    # ptrace of the server's processes (another user's) needs root; CI runs as root, so there
    # this fails instead of skipping (the SQLite test traces its own child and needs no root).
    require("strace", os.geteuid() == 0, "strace of the PostgreSQL server's processes needs root")
    server = subprocess.run(["pgrep", "-x", "-u", "postgres", "postgres"], capture_output=True)
    server_pids = server.stdout.decode().split()
    require("postgres", bool(server_pids), "the PostgreSQL server processes are not visible here")
    name = f"agora-fsync-{uuid.uuid4().hex[:8]}"
    schema = name.replace("-", "_")
    server_trace = tmp_path / "server.txt"
    attach = [strace, "-f", "-qq", "-ttt", "-y", "-e", "trace=fsync,fdatasync"]
    attach += ["-o", str(server_trace)]
    for pid in server_pids:
        attach += ["-p", pid]
    tracer = subprocess.Popen(attach, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # strace attaches to every server process before the first append
        client_trace = tmp_path / "client.txt"
        argv = [strace, "-qq", "-ttt", "-e", "trace=write", "-o", str(client_trace)]
        argv += [sys.executable, "-m", "tests.hub.log.fsync_driver", "postgres"]
        argv += [f"{POSTGRES_DSN}?application_name={name}", str(COUNT), schema]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        _drop_schema(schema)
    pids_line = next(x for x in done.stdout.decode().splitlines() if x.startswith("PIDS"))
    pids = {int(p) for p in pids_line.split()[1:]}
    assert pids, "the driver found no server process of its connections"
    syncs = _syncs(server_trace.read_text(), "pg_wal/", pids)
    _assert_synced_before_each_ack(_acks(client_trace.read_text()), syncs)


def _drop_schema(schema: str) -> None:
    from tests.support.postgres import pg_run

    async def drop(conn: object) -> None:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[attr-defined]

    pg_run(drop)
