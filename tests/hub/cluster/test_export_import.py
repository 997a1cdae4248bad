"""``agora export`` / ``agora import`` move a workspace between SQLite and PostgreSQL verbatim:
SQLite → PostgreSQL → SQLite, with the real command in processes of their own. Seqs, ids,
timestamps, producers, payloads and hashes are identical at every stop (positions are each
store's own), the blobs travel along, and ``agora verify`` passes on both stores."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from hub.core.events import Event, decode_event
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

BIG = os.urandom(200_000)  # above the blob threshold: stored as a blob, referenced by sha256
DRAFTS = [
    {"kind": "needWork", "correlationId": "t1", "topic": "build", "payload": {"title": "Build"}},
    {"kind": "workClaimed", "correlationId": "t1", "payload": {}},
    {"kind": "fileWritten", "payload": {"path": "src/app.py", "text": "print('héllo')\n"}},
    {
        "kind": "fileWritten",
        "payload": {"path": "data.bin", "base64": base64.b64encode(BIG).decode()},
    },
    {
        "kind": "messagePosted",
        "payload": {"text": "nul \u0000 and emoji \U0001f600", "data": [1, {}]},
    },
    {"kind": "completed", "correlationId": "t1", "payload": {"ok": True}},
]


def agora(*argv: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hub", *argv],
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (argv, result.stdout, result.stderr)
    return result.stdout


def events_of(export: Path) -> list[Event]:
    return [decode_event(line) for line in export.read_bytes().splitlines() if line.strip()]


def without_position(events: list[Event]) -> list[Event]:
    return [msgspec.structs.replace(e, position=0) for e in events]


def test_sqlite_to_postgresql_to_sqlite_verbatim(tmp_path: Path, pg_url: str) -> None:
    first, last = tmp_path / "first", tmp_path / "last"
    for i, draft in enumerate(DRAFTS):  # one batch per event: distinct seqs and timestamps
        agora(
            "append",
            "demo",
            "--producer",
            f"agent-{i % 2}",
            "--data",
            str(first),
            stdin=json.dumps(draft) + "\n",
        )
    agora("append", "other", "--data", str(first), stdin='{"kind":"messagePosted"}\n')

    # SQLite → PostgreSQL, where another workspace already holds positions 1-2.
    agora(
        "append",
        "resident",
        "--store",
        pg_url,
        "--data",
        str(tmp_path / "pg"),
        stdin='{"kind":"messagePosted"}\n{"kind":"messagePosted"}\n',
    )
    out1, blobs1 = tmp_path / "1.jsonl", tmp_path / "blobs1"
    agora("export", "demo", "--data", str(first), "-o", str(out1), "--blobs", str(blobs1))
    agora(
        "import",
        "demo",
        "--store",
        pg_url,
        "--data",
        str(tmp_path / "pg"),
        "-i",
        str(out1),
        "--blobs",
        str(blobs1),
    )
    verified = agora("verify", "--store", pg_url, "--data", str(tmp_path / "pg"))
    assert f"ok demo {len(DRAFTS)} events" in verified and "ok resident 2 events" in verified

    # PostgreSQL → SQLite.
    out2, blobs2 = tmp_path / "2.jsonl", tmp_path / "blobs2"
    agora(
        "export",
        "demo",
        "--store",
        pg_url,
        "--data",
        str(tmp_path / "pg"),
        "-o",
        str(out2),
        "--blobs",
        str(blobs2),
    )
    agora("import", "demo", "--data", str(last), "-i", str(out2), "--blobs", str(blobs2))
    assert f"ok demo {len(DRAFTS)} events" in agora("verify", "--data", str(last))
    out3 = tmp_path / "3.jsonl"
    agora("export", "demo", "--data", str(last), "-o", str(out3))

    original, via_pg, back = events_of(out1), events_of(out2), events_of(out3)
    assert [e.seq for e in original] == list(range(1, len(DRAFTS) + 1))
    assert [e.position for e in via_pg] == list(range(3, 3 + len(DRAFTS)))  # the store's own
    assert without_position(via_pg) == without_position(original)
    assert without_position(back) == without_position(original)
    assert [e.hash for e in back] == [e.hash for e in original]
    assert len({e.timestamp for e in original}) > 1
    # The stored bytes are the same but for the position.
    strip = [
        json.dumps({**json.loads(x), "position": 0}, sort_keys=True)
        for x in out1.read_text().splitlines()
    ]
    assert strip == [
        json.dumps({**json.loads(x), "position": 0}, sort_keys=True)
        for x in out3.read_text().splitlines()
    ]
    # The blob made the whole trip.
    state = json.loads(agora("state", "demo", "--json", "--data", str(last)))
    entry = state["files"]["data.bin"]
    blob = entry["blob"]
    assert (last / "blobs" / blob[:2] / blob[2:]).read_bytes() == BIG
