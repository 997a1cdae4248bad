"""The audit CLI (``append``, ``replay``, ``state``, ``verify``, ``export``, ``import``,
``workspaces``) driven through ``hub.cli.main`` in-process, on real SQLite data directories;
plus one run of the real console entry point in a subprocess."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub.cli import main
from hub.commands._audit import PAGE, progress
from hub.commands.timeline import format_time
from hub.commands.verify import PARALLEL_MIN, RANGE_MAX, RANGE_MIN, Split
from hub.core.chain import compute_hash
from hub.core.events import Event, decode_event
from hub.core.projections.snapshots import to_snapshot
from hub.log.factory import open_store
from hub.log.loading import load_state
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces
from tests.support.postgres import drop_schemas, need_postgres, new_schema, pg_run, url_for

REPO = Path(__file__).resolve().parents[3]

NEED = {
    "kind": "needWork",
    "correlationId": "t1",
    "topic": "build",
    "payload": {"title": "Build the app"},
}
WRITE_1 = {"kind": "fileWritten", "payload": {"path": "src/app.py", "text": "print(1)\n"}}
WRITE_2 = {
    "kind": "fileWritten",
    "payload": {"path": "src/app.py", "text": "print(2)\n", "baseRev": 1},
}
MESSAGE = {"kind": "messagePosted", "payload": {"text": "hello"}}


def jsonl(*events: object) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


class Agora:
    """Runs ``agora`` in-process against one data directory."""

    def __init__(
        self, data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.data = data
        self.capsys = capsys
        self.monkeypatch = monkeypatch

    def __call__(
        self, *argv: str, stdin: str | bytes = "", data: Path | None = None
    ) -> tuple[int, str, str]:
        raw = stdin.encode() if isinstance(stdin, str) else stdin
        self.monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
        args = [*argv, "--data", str(data or self.data)]
        try:
            code = main(args)
        except SystemExit as e:  # argparse usage errors
            code = int(e.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str, stdin: str | bytes = "", data: Path | None = None) -> str:
        code, out, err = self(*argv, stdin=stdin, data=data)
        assert code == 0, err
        return out

    def head(self, workspace: str = "demo", data: Path | None = None) -> int:
        rows = json.loads(self.ok("workspaces", "--json", data=data))
        return next((r["head"] for r in rows if r["workspace"] == workspace), 0)


@pytest.fixture
def agora(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Agora:
    return Agora(tmp_path / "data", capsys, monkeypatch)


@pytest.fixture
def demo(agora: Agora) -> Agora:
    """A ``demo`` workspace with 4 events: needWork, two writes of one file, a message."""
    agora.ok("append", "demo", stdin=jsonl(NEED, WRITE_1, WRITE_2, MESSAGE))
    return agora


def db(data: Path) -> sqlite3.Connection:
    return sqlite3.connect(data / "agora.db")


# -- append / replay -------------------------------------------------------------------------


def test_append_prints_seqs_and_replay_shows_one_line_per_event(agora: Agora) -> None:
    out = agora.ok("append", "demo", "--producer", "alice", stdin=jsonl(NEED, WRITE_1, WRITE_2))
    seqs = [line.split() for line in out.splitlines()]
    assert [int(s) for s, _ in seqs] == [1, 2, 3]
    out = agora.ok("replay", "demo")
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].endswith('alice  needWork  #t1 build "Build the app"')
    assert "  seq 2  alice  fileWritten  src/app.py rev 1 (9 B)" in lines[1]
    assert "  seq 3  alice  fileWritten  src/app.py rev 2 (9 B)" in lines[2]
    assert lines[0].split()[0].endswith("Z")  # UTC ISO time with ms


def test_append_ignores_blank_lines_and_json_output(agora: Agora) -> None:
    out = agora.ok("append", "demo", "--json", stdin="\n" + jsonl(NEED) + "\n  \n" + jsonl(MESSAGE))
    result = json.loads(out)
    assert result["workspace"] == "demo"
    assert result["seqs"] == [1, 2]
    assert len(result["ids"]) == 2
    assert result["duplicate"] is False


def test_append_same_ids_again_is_a_duplicate(agora: Agora) -> None:
    events = jsonl({**NEED, "id": "n1"}, {**MESSAGE, "id": "m1"})
    assert agora.ok("append", "demo", stdin=events) == "1 n1\n2 m1\n"
    code, out, err = agora("append", "demo", stdin=events)
    assert code == 0
    assert out == "1 n1\n2 m1\n"
    assert "nothing appended" in err
    assert agora.head() == 2


def test_replay_json_round_trips_the_stored_envelopes(demo: Agora) -> None:
    lines = demo.ok("replay", "demo", "--json").splitlines()
    assert len(lines) == 4
    events = [decode_event(line) for line in lines]
    assert [e.seq for e in events] == [1, 2, 3, 4]
    for event in events:
        assert event.hash == compute_hash(event)
    # Stored bytes verbatim: the same as the export, and what import restores.
    assert demo.ok("export", "demo").splitlines() == lines


def test_replay_ranges(demo: Agora) -> None:
    lines = demo.ok("replay", "demo", "--after-seq", "2").splitlines()
    assert [line.split()[2] for line in lines] == ["3", "4"]
    # The fold starts at --after-seq: the second write is still rev 2.
    assert "src/app.py rev 2" in lines[0]
    lines = demo.ok("replay", "demo", "--after-seq", "1", "--until-seq", "2").splitlines()
    assert len(lines) == 1 and "  seq 2  " in lines[0]
    assert demo.ok("replay", "demo", "--after-seq", "99") == ""
    jl = demo.ok("replay", "demo", "--json", "--until-seq", "3").splitlines()
    assert [json.loads(line)["seq"] for line in jl] == [1, 2, 3]


def test_replay_until_time(demo: Agora) -> None:
    first = json.loads(demo.ok("replay", "demo", "--json").splitlines()[0])
    time.sleep(0.01)
    demo.ok("append", "demo", stdin=jsonl(MESSAGE))
    until = format_time(first["timestamp"])
    text = demo.ok("replay", "demo", "--until-time", until).splitlines()
    assert len(text) == 4  # the first batch, not the later message
    jl = demo.ok("replay", "demo", "--json", "--until-time", until).splitlines()
    assert len(jl) == 4
    assert demo.ok("replay", "demo", "--until-time", "1970-01-01") == ""
    assert (
        len(demo.ok("replay", "demo", "--until-time", "2999-01-01T00:00+02:00").splitlines()) == 5
    )


def test_replay_unknown_workspace_and_usage_errors(demo: Agora) -> None:
    code, out, err = demo("replay", "nope")
    assert (code, out) == (1, "")
    assert "error: notFound: workspace 'nope' has no events" in err
    code, _, err = demo("replay", "bad/name")
    assert code == 2 and "invalid workspace name" in err
    code, _, err = demo("replay", "demo", "--until-time", "yesterday")
    assert code == 2 and "invalid time" in err
    code, _, _ = demo("replay", "demo", "--until-seq", "2", "--until-time", "2024-01-01")
    assert code == 2


def test_read_commands_refuse_a_missing_data_directory(agora: Agora, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for argv in (["replay", "w"], ["state", "w"], ["verify"], ["export", "w"], ["workspaces"]):
        code, _, err = agora(*argv, data=missing)
        assert code == 1, argv
        assert "no data directory" in err
    assert not missing.exists()


# -- bad input -------------------------------------------------------------------------------

BAD_BATCHES = {
    "malformed json": ([jsonl(NEED), '{"kind": "needWork",\n'], "line 2: invalid JSON: "),
    "unknown kind": ([jsonl(NEED), jsonl({"kind": "fileEaten"})], "line 2: kind: Invalid value"),
    "bad path": (
        [jsonl(NEED, {"kind": "fileWritten", "payload": {"path": "../etc", "text": ""}})],
        "line 2: payload.path: path '../etc' is not normalised",
    ),
    "wrong type": (
        [jsonl(NEED, {"kind": "fileWritten", "payload": {"path": 7, "text": ""}})],
        "line 2: payload.path: Expected `str`, got `int`",
    ),
    "missing field": (
        [jsonl(MESSAGE, {"kind": "fileDeleted", "payload": {}})],
        "line 2: payload: Object missing required field `path`",
    ),
    "two content fields": (
        [jsonl(NEED, {"kind": "fileWritten", "payload": {"path": "a", "text": "", "blob": "x"}})],
        "line 2: payload: fileWritten needs exactly one of",
    ),
    "stale baseRev": (
        [jsonl(NEED, {**WRITE_1, "payload": {**WRITE_1["payload"], "baseRev": 5}})],  # type: ignore[dict-item]
        "conflict: line 2: file 'src/app.py' is at rev 2, not baseRev 5",
    ),
    "delete of a missing file": (
        [jsonl(MESSAGE, {"kind": "fileDeleted", "payload": {"path": "nope.txt"}})],
        "notFound: line 2: no file 'nope.txt' to delete",
    ),
    "terminal work item": (
        [jsonl({"kind": "completed", "correlationId": "t1"}, {**NEED})],
        "conflict: line 2: needWork is not allowed",
    ),
    "hub-only kind": (
        [jsonl(MESSAGE, {"kind": "memberJoined", "payload": {"agent": "x"}})],
        "forbidden: line 2: events of kind 'memberJoined'",
    ),
    "other workspace": (
        [jsonl(MESSAGE, {**MESSAGE, "workspace": "other"})],
        "line 2: workspace: the event names workspace 'other'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_input_names_the_line_and_appends_nothing(demo: Agora, case: str) -> None:
    parts, expected = BAD_BATCHES[case]
    before = demo.ok("replay", "demo", "--json")
    code, out, err = demo("append", "demo", stdin="\n" + "".join(parts))
    assert code == 1, err
    assert out == ""
    # Line numbers count the blank first line too.
    expected = expected.replace("line 2", "line 3")
    assert expected in err
    assert err.startswith("agora append: error: ")
    assert demo.ok("replay", "demo", "--json") == before  # head and log unchanged


def test_every_bad_line_is_reported(demo: Agora) -> None:
    bad = jsonl({"kind": "nope"}, NEED, {"kind": "fileWritten", "payload": {"path": 1}})
    code, _, err = demo("append", "demo", stdin=bad + "not json\n")
    assert code == 1
    assert [line.split(": ")[3] for line in err.splitlines()] == ["line 1", "line 3", "line 4"]
    assert demo.head() == 4


def test_append_empty_input_and_usage_errors(demo: Agora) -> None:
    code, _, err = demo("append", "demo", stdin="\n\n")
    assert code == 1 and "no events on stdin" in err
    code, _, err = demo("append", "demo", "--expected-seq", "-1", stdin=jsonl(MESSAGE))
    assert code == 2 and "must be >= 0" in err
    code, _, err = demo("append", "bad name", stdin=jsonl(MESSAGE))
    assert code == 2
    assert demo.head() == 4


def test_append_applies_the_configured_limits(demo: Agora, tmp_path: Path) -> None:
    config = tmp_path / "agora.toml"
    config.write_text("[limits]\nmax_file_bytes = 4\n")
    big = {"kind": "fileWritten", "payload": {"path": "a.txt", "text": "hello"}}
    code, _, err = demo("append", "demo", "--config", str(config), stdin=jsonl(MESSAGE, big))
    assert code == 1
    assert "error: tooLarge: line 2: payload: file content is 5 bytes; the limit is 4" in err
    assert demo.head() == 4
    config.write_text("[limits]\nmax_file_byte = 4\n")  # a typo is a usage error
    code, _, err = demo("append", "demo", "--config", str(config), stdin=jsonl(MESSAGE))
    assert code == 2 and "max_file_byte" in err
    assert demo.head() == 4


def test_append_expected_seq(demo: Agora) -> None:
    code, _, err = demo("append", "demo", "--expected-seq", "3", stdin=jsonl(MESSAGE))
    assert code == 1
    assert "error: conflict: " in err and "head is 4" in err
    assert demo.head() == 4
    assert demo.ok("append", "demo", "--expected-seq", "4", stdin=jsonl(MESSAGE)).startswith("5 ")


# -- state -----------------------------------------------------------------------------------


def test_state_time_travel_differs_from_the_head(demo: Agora) -> None:
    now = json.loads(demo.ok("state", "demo", "--json"))
    then = json.loads(demo.ok("state", "demo", "--json", "--at-seq", "2"))
    assert now["seq"] == 4 and then["seq"] == 2
    assert now["files"]["src/app.py"]["rev"] == 2
    assert then["files"]["src/app.py"]["rev"] == 1
    assert then["files"]["src/app.py"]["text"] == "print(1)\n"
    assert (now["messages"], then["messages"]) == (1, 0)
    assert now["workItems"]["t1"]["status"] == "requested"

    text = demo.ok("state", "demo")
    assert text.splitlines()[0] == "workspace demo at seq 4 (the head)"
    assert "  src/app.py  rev 2  9 B  by cli at seq 3" in text
    assert "  #t1  requested  requester cli  topic build" in text
    assert "messages: 1" in text
    old = demo.ok("state", "demo", "--at-seq", "2")
    assert old.splitlines()[0] == "workspace demo at seq 2 (head 4)"
    assert "src/app.py  rev 1" in old
    assert demo.ok("state", "demo", "--at-seq", "0").count(": 0") == 6  # empty before seq 1
    # Beyond the head is the head.
    assert demo.ok("state", "demo", "--at-seq", "99") == text


def test_state_unknown_workspace(demo: Agora) -> None:
    code, _, err = demo("state", "nope")
    assert code == 1 and "notFound" in err


# -- verify, snapshots, tampering ------------------------------------------------------------

# Each verify test runs in one process and in ranges: --range-events cuts even these short logs
# into ranges of one event, the first checked by this process, the others by a worker process.
VERIFY_JOBS = {"one process": ("--jobs", "1"), "in ranges": ("--jobs", "2", "--range-events", "1")}


@pytest.fixture(params=sorted(VERIFY_JOBS))
def jobs(request: pytest.FixtureRequest) -> tuple[str, ...]:
    return VERIFY_JOBS[request.param]


def test_verify_all_workspaces(demo: Agora, jobs: tuple[str, ...]) -> None:
    demo.ok("append", "other", stdin=jsonl(MESSAGE, MESSAGE))
    code, out, err = demo("verify", *jobs)
    assert (code, err) == (0, "")  # no progress lines: stderr is not a terminal
    assert out.splitlines() == [
        "ok demo 4 events",
        "ok other 2 events",
        "ok: 2 workspaces, 6 events verified",
    ]
    assert demo.ok("verify", "other", *jobs).splitlines()[0] == "ok other 2 events"
    code, _, err = demo("verify", "nope", *jobs)
    assert code == 1 and "notFound" in err


def test_verify_names_the_tampered_seq(demo: Agora, jobs: tuple[str, ...]) -> None:
    demo.ok("append", "other", stdin=jsonl(MESSAGE))
    with db(demo.data) as conn:
        (body,) = conn.execute(
            "SELECT body FROM events WHERE workspace = ? AND seq = ?", ("demo", 2)
        ).fetchone()
        event = json.loads(body)
        event["payload"]["text"] = "print('pwned')\n"  # same hash, other content
        conn.execute(
            "UPDATE events SET body = ? WHERE workspace = ? AND seq = ?",
            (json.dumps(event).encode(), "demo", 2),
        )
    conn.close()
    code, out, err = demo("verify", *jobs)
    assert code == 1
    assert "workspace demo: seq 2: hash does not match content" in err
    assert "ok other 1 events" in out  # the other workspace is still checked
    assert out.splitlines()[-1] == "FAILED: 1 of 2 workspaces damaged (2 events checked)"
    code, _, err = demo("verify", "demo", *jobs)
    assert code == 1 and "seq 2: hash does not match content" in err


def test_verify_names_a_seq_whose_body_was_replaced_by_text(
    demo: Agora, jobs: tuple[str, ...]
) -> None:
    with db(demo.data) as conn:
        conn.execute(
            "UPDATE events SET body = ? WHERE workspace = 'demo' AND seq = 2", ('{"kind":"x"}',)
        )
    conn.close()
    code, _, err = demo("verify", *jobs)
    assert code == 1
    assert "workspace demo: " in err and "seq 2" in err


def test_verify_names_a_seq_that_does_not_decode(demo: Agora, jobs: tuple[str, ...]) -> None:
    with db(demo.data) as conn:
        conn.execute(
            "UPDATE events SET body = ? WHERE workspace = 'demo' AND seq = 2", (b'{"kind":"x"}',)
        )
    conn.close()
    code, _, err = demo("verify", *jobs)
    assert code == 1
    assert "workspace demo: stored event at seq 2 cannot be decoded" in err


def test_verify_names_a_gap(demo: Agora, jobs: tuple[str, ...]) -> None:
    with db(demo.data) as conn:
        conn.execute("DELETE FROM events WHERE workspace = 'demo' AND seq = 3")
    conn.close()
    code, _, err = demo("verify", *jobs)
    assert code == 1
    assert "workspace demo: seq 3: gap before seq 4" in err


def test_progress_line_only_when_enabled(capsys: pytest.CaptureFixture[str]) -> None:
    async def work(enabled: bool) -> None:
        async with progress("verify big: hash chain", enabled=enabled, every=0.01):
            await asyncio.sleep(0.05)

    asyncio.run(work(False))
    assert capsys.readouterr().err == ""
    asyncio.run(work(True))
    err = capsys.readouterr().err
    assert "\rverify big: hash chain… 0s" in err.replace("\x1b[K", "")
    assert err.endswith("\r\x1b[K")  # the line is cleared at the end


def save_snapshot(data: Path, workspace: str, at_seq: int, messages_delta: int = 0) -> None:
    """Save a snapshot of the state at ``at_seq`` (optionally wrong by ``messages_delta``)."""

    async def go() -> None:
        async with open_store(None, data) as store:
            state = await load_state(store, workspace, at_seq=at_seq, use_snapshots=False)
            state.messages += messages_delta
            await store.save_snapshot(to_snapshot(state))

    asyncio.run(go())


def test_snapshots_change_nothing_in_verify_or_state(demo: Agora, jobs: tuple[str, ...]) -> None:
    demo.ok("append", "demo", stdin=jsonl(MESSAGE, MESSAGE))
    save_snapshot(demo.data, "demo", 3)
    with_snapshots = [
        demo.ok("verify", *jobs),
        demo.ok("state", "demo"),
        demo.ok("state", "demo", "--json"),
        demo.ok("state", "demo", "--at-seq", "4", "--json"),
    ]
    with db(demo.data) as conn:
        assert conn.execute("DELETE FROM snapshots").rowcount == 1
    conn.close()
    without = [
        demo.ok("verify", *jobs),
        demo.ok("state", "demo"),
        demo.ok("state", "demo", "--json"),
        demo.ok("state", "demo", "--at-seq", "4", "--json"),
    ]
    assert with_snapshots == without


def test_verify_catches_a_snapshot_that_disagrees_with_the_log(
    demo: Agora, jobs: tuple[str, ...]
) -> None:
    save_snapshot(demo.data, "demo", 3, messages_delta=5)
    code, _, err = demo("verify", *jobs)
    assert code == 1
    assert "workspace demo: seq 4: the state from the snapshot at seq 3 differs" in err
    assert "(messages)" in err


def test_verify_warns_about_an_unusable_snapshot(demo: Agora, jobs: tuple[str, ...]) -> None:
    save_snapshot(demo.data, "demo", 3)
    with db(demo.data) as conn:
        conn.execute("UPDATE snapshots SET body = x'00'")
    conn.close()
    code, out, err = demo("verify", *jobs)
    assert code == 0
    assert "snapshot at seq 3 is unusable" in err
    assert "ok demo 4 events" in out


def test_verify_reads_each_event_once(demo: Agora, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain, the snapshot against a rebuild and the blob references are all checked in
    one pass over the log: every event is read (and decoded) once, not once per check."""
    demo.ok("append", "demo", stdin=jsonl(*[MESSAGE] * 20))
    save_snapshot(demo.data, "demo", 10)
    read: list[int] = []
    read_batch, read_raw = SqliteEventStore.read_batch, SqliteEventStore.read_raw

    async def counted_batch(self: SqliteEventStore, *args: Any, **kwargs: Any) -> list[Event]:
        page = await read_batch(self, *args, **kwargs)
        read.extend(e.seq for e in page)
        return page

    async def counted_raw(self: SqliteEventStore, *args: Any, **kwargs: Any) -> Any:
        page = await read_raw(self, *args, **kwargs)
        read.extend(seq for seq, _ in page)
        return page

    monkeypatch.setattr(SqliteEventStore, "read_batch", counted_batch)
    monkeypatch.setattr(SqliteEventStore, "read_raw", counted_raw)
    assert "ok demo 24 events" in demo.ok("verify", "demo")
    assert sorted(read) == list(range(1, 25))


def test_verify_empty_store(agora: Agora) -> None:
    agora.data.mkdir()
    assert agora.ok("verify") == "ok: 0 workspaces, 0 events verified\n"


def test_verify_jobs_must_be_a_positive_number(demo: Agora) -> None:
    for bad in ("0", "-1", "two"):
        code, _, err = demo("verify", "--jobs", bad)
        assert code == 2 and "--jobs" in err, bad


# -- verify in ranges: the first break of the log, wherever the workers find theirs ----------

LONG = 40  # events of the long log: this process checks seqs 1-10, the workers 11-20, 21-30, 31-40
IN_RANGES = ("--jobs", "2", "--range-events", "10")


class LogRows:
    """Direct access to the stored rows of one workspace, on SQLite or PostgreSQL."""

    def __init__(self, data: Path, schema: str | None) -> None:
        self.data = data
        self.schema = schema

    def args(self) -> tuple[str, ...]:
        return () if self.schema is None else ("--store", url_for(self.schema))

    def _sql(self, sqlite: str, postgres: str, *params: object) -> list[Any]:
        if self.schema is None:
            with db(self.data) as conn:
                rows = conn.execute(sqlite, params).fetchall()
            conn.close()
            return rows
        sql = postgres.replace("events", f'"{self.schema}".events')
        return list(pg_run(lambda c: c.fetch(sql, *params)))

    def body(self, seq: int) -> dict[str, Any]:
        (row,) = self._sql(
            "SELECT body FROM events WHERE workspace = 'demo' AND seq = ?",
            "SELECT body FROM events WHERE workspace = 'demo' AND seq = $1",
            seq,
        )
        decoded: dict[str, Any] = json.loads(bytes(row[0]))
        return decoded

    def put(self, seq: int, body: bytes) -> None:
        self._sql(
            "UPDATE events SET body = ? WHERE workspace = 'demo' AND seq = ?",
            "UPDATE events SET body = $1 WHERE workspace = 'demo' AND seq = $2",
            body,
            seq,
        )

    def edit(self, seq: int, **fields: Any) -> None:
        """Rewrite fields of the stored event at ``seq`` (``text``: its message), hash kept."""
        event = self.body(seq)
        if "text" in fields:
            event["payload"]["text"] = fields.pop("text")
        event.update(fields)
        self.put(seq, json.dumps(event).encode())

    def delete(self, seq: int) -> None:
        self._sql(
            "DELETE FROM events WHERE workspace = 'demo' AND seq = ?",
            "DELETE FROM events WHERE workspace = 'demo' AND seq = $1",
            seq,
        )


@pytest.fixture(params=["sqlite", "postgres"])
def long_log(agora: Agora, request: pytest.FixtureRequest) -> Iterator[LogRows]:
    """A ``demo`` workspace of :data:`LONG` messages, on SQLite or on a fresh PostgreSQL
    schema (dropped afterwards)."""
    schema = None
    if request.param == "postgres":
        need_postgres()
        schema = new_schema("verify")
    rows = LogRows(agora.data, schema)
    try:
        agora.ok("append", "demo", *rows.args(), stdin=jsonl(*[MESSAGE] * LONG))
        yield rows
    finally:
        if schema is not None:
            drop_schemas([schema])


def verify_both_ways(agora: Agora, rows: LogRows) -> tuple[int, str, str]:
    """``agora verify`` in ranges; it must say exactly what one process says, reading the
    same pages (--range-events sets their size in both: a page with an event that does not
    decode is named for it, even after a break earlier in the page)."""
    in_ranges = agora("verify", *IN_RANGES, *rows.args())
    assert in_ranges == agora("verify", "--jobs", "1", *IN_RANGES[2:], *rows.args())
    return in_ranges


@pytest.mark.parametrize("events", [PARALLEL_MIN, 432_109, 1_000_000, 10_000_000])
@pytest.mark.parametrize("jobs", [2, 3, 64])
@pytest.mark.parametrize("folds", [True, False])
def test_the_ranges_of_a_long_log(events: int, jobs: int, folds: bool) -> None:
    """This process's share and the workers' ranges cover the log once, in order, each
    boundary a whole number of pages, and no more ranges than RANGE_MAX asks for or than
    RANGE_MIN allows workers."""
    first, ranges = Split().plan(events, jobs, folds=folds)
    assert ranges and first % PAGE == 0
    assert [lo for lo, _ in ranges] == [first] + [hi for _, hi in ranges[:-1]]
    assert ranges[-1][1] == events
    assert all(lo % PAGE == 0 and hi - lo <= RANGE_MAX for lo, hi in ranges)
    assert len(ranges) <= max(jobs - 1, math.ceil(events / RANGE_MAX))
    assert len({hi - lo for lo, hi in ranges[:-1]}) <= 1  # alike, but for the last one
    assert len(ranges) <= max(events // RANGE_MIN, math.ceil(events / RANGE_MAX))
    assert Split().plan(events, 1, folds=folds) == (events, [])
    assert Split().plan(PARALLEL_MIN - 1, jobs, folds=folds) == (PARALLEL_MIN - 1, [])


def test_verify_in_ranges_of_a_sound_log(agora: Agora, long_log: LogRows) -> None:
    assert verify_both_ways(agora, long_log) == (
        0,
        f"ok demo {LONG} events\nok: 1 workspace, {LONG} events verified\n",
        "",
    )


def test_verify_in_ranges_names_a_break_in_a_workers_range(agora: Agora, long_log: LogRows) -> None:
    long_log.edit(25, text="forged")
    code, out, err = verify_both_ways(agora, long_log)
    assert code == 1
    assert err == "agora verify: error: workspace demo: seq 25: hash does not match content\n"
    assert out == "FAILED: 1 of 1 workspace damaged (24 events checked)\n"


def test_verify_in_ranges_names_the_lowest_break(agora: Agora, long_log: LogRows) -> None:
    # The worker's later range breaks at its first event, the earlier one at its last: the
    # earlier range's break is still the one named.
    long_log.edit(21, text="forged")
    long_log.edit(19, text="forged")
    code, _, err = verify_both_ways(agora, long_log)
    assert code == 1
    assert err == "agora verify: error: workspace demo: seq 19: hash does not match content\n"
    # ... and one in this process's own range comes before both.
    long_log.edit(4, text="forged")
    assert "seq 4: hash does not match content" in verify_both_ways(agora, long_log)[2]


DAMAGES = {
    # the event whose hash the next range is checked against
    "edited at a range's end": (lambda rows: rows.edit(20, text="x"), "seq 20: hash does not"),
    "prev rewritten": (lambda rows: rows.edit(21, prev="0" * 64), "seq 21: prev does not match"),
    "gap at a range's start": (lambda rows: rows.delete(21), "seq 21: gap before seq 22"),
    "gap inside a range": (lambda rows: rows.delete(27), "seq 27: gap before seq 28"),
    "undecodable": (
        lambda rows: rows.put(33, b'{"kind":"x"}'),
        "stored event at seq 33 cannot be decoded",
    ),
    "undecodable after a break": (
        lambda rows: (rows.edit(12, text="x"), rows.put(25, b"{")),
        "seq 12: hash does not match content",
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_verify_in_ranges_reports_what_one_process_reports(
    agora: Agora, long_log: LogRows, damage: str
) -> None:
    tamper, expected = DAMAGES[damage]
    tamper(long_log)
    code, _, err = verify_both_ways(agora, long_log)
    assert code == 1
    assert f"workspace demo: {expected}" in err


def test_verify_in_ranges_of_a_log_cut_short(agora: Agora, long_log: LogRows) -> None:
    # PostgreSQL keeps each head in a table of its own, which still says 40: the last range
    # ends early without a break, and the events there are counted, not the head's seq.
    long_log.delete(LONG)
    assert verify_both_ways(agora, long_log)[:2] == (
        0,
        f"ok demo {LONG - 1} events\nok: 1 workspace, {LONG - 1} events verified\n",
    )


def test_verify_in_ranges_compares_the_snapshot(agora: Agora) -> None:
    agora.ok("append", "demo", stdin=jsonl(*[MESSAGE] * LONG))
    save_snapshot(agora.data, "demo", 15)
    assert verify_both_ways(agora, LogRows(agora.data, None))[0] == 0
    save_snapshot(agora.data, "demo", 35, messages_delta=1)
    code, _, err = verify_both_ways(agora, LogRows(agora.data, None))
    assert code == 1
    assert f"seq {LONG}: the state from the snapshot at seq 35 differs" in err


# -- export / import -------------------------------------------------------------------------


def test_export_import_verify_keeps_every_hash(demo: Agora, tmp_path: Path) -> None:
    export = tmp_path / "demo.jsonl"
    code, out, err = demo("export", "demo", "--output", str(export))
    assert code == 0 and out == ""
    assert "exported 4 events" in err
    fresh = tmp_path / "fresh"
    out = demo.ok("import", "demo", "--input", str(export), data=fresh)
    assert out == "imported 4 events into demo (head 4)\n"
    assert demo.ok("verify", data=fresh).splitlines()[0] == "ok demo 4 events"

    def hashes(data: Path) -> list[tuple[int, str, str]]:
        lines = demo.ok("export", "demo", data=data).splitlines()
        return [(e.seq, e.id, e.hash or "") for e in map(decode_event, lines)]

    assert hashes(fresh) == hashes(demo.data)
    assert demo.ok("replay", "demo", data=fresh) == demo.ok("replay", "demo")
    assert demo.ok("state", "demo", "--json", data=fresh) == demo.ok("state", "demo", "--json")
    # The fresh copy takes appends, chained on the imported head.
    demo.ok("append", "demo", stdin=jsonl(MESSAGE), data=fresh)
    assert demo.ok("verify", "demo", data=fresh).startswith("ok demo 5 events")


def test_import_from_stdin(demo: Agora, tmp_path: Path) -> None:
    exported = demo.ok("export", "demo")
    out = demo.ok("import", "demo", stdin=exported, data=tmp_path / "fresh")
    assert out.startswith("imported 4 events")


def test_import_refuses_a_broken_chain_naming_the_seq(demo: Agora, tmp_path: Path) -> None:
    lines = demo.ok("export", "demo").splitlines()
    event = json.loads(lines[2])
    event["payload"]["text"] = "print('edited')\n"
    lines[2] = json.dumps(event)
    fresh = tmp_path / "fresh"
    code, out, err = demo("import", "demo", stdin="\n".join(lines) + "\n", data=fresh)
    assert code == 1 and out == ""
    assert "line 3: seq 3: hash does not match content" in err
    assert demo.head(data=fresh) == 0  # nothing imported


def test_import_refusals(demo: Agora, tmp_path: Path) -> None:
    exported = demo.ok("export", "demo")
    # A workspace that already has events.
    code, _, err = demo("import", "demo", stdin=exported)
    assert code == 1
    assert "conflict: workspace 'demo' is not empty (head 4)" in err
    # Another workspace's export.
    fresh = tmp_path / "fresh"
    code, _, err = demo("import", "other", stdin=exported, data=fresh)
    assert code == 1
    assert "line 1: workspace: the export is of workspace 'demo', not 'other'" in err
    # A missing seq.
    lines = exported.splitlines()
    code, _, err = demo("import", "demo", stdin="\n".join(lines[:1] + lines[2:]), data=fresh)
    assert code == 1 and "seq 2: gap before seq 3" in err
    # Not an export at all.
    code, _, err = demo("import", "demo", stdin="hello\n", data=fresh)
    assert code == 1 and "line 1: invalid JSON: " in err
    code, _, err = demo("import", "demo", stdin="", data=fresh)
    assert code == 1 and "no events in the input" in err
    code, _, err = demo("import", "demo", "--input", str(tmp_path / "nope.jsonl"), data=fresh)
    assert code == 1 and "notFound: no such file" in err
    assert demo.head(data=fresh) == 0


def test_blobs_travel_with_export_blobs(agora: Agora, tmp_path: Path) -> None:
    big = base64.b64encode(b"x" * 100_000).decode()  # above the blob threshold
    agora.ok(
        "append",
        "demo",
        stdin=jsonl({"kind": "fileWritten", "payload": {"path": "big.bin", "base64": big}}),
    )
    event = json.loads(agora.ok("export", "demo"))
    sha = event["payload"]["blob"]
    assert "base64" not in event["payload"]

    export, blobs = tmp_path / "demo.jsonl", tmp_path / "blobs"
    code, _, err = agora("export", "demo", "-o", str(export), "--blobs", str(blobs))
    assert code == 0 and "1 blob(s) copied" in err
    assert (blobs / sha[:2] / sha[2:]).is_file()

    # Without the blobs: imported, with a warning naming the blob.
    code, out, err = agora("import", "demo", "-i", str(export), data=tmp_path / "bare")
    assert code == 0 and out.startswith("imported 1 events")
    assert f"warning: blob {sha} (referenced at seq 1) is not in the blob store" in err
    # With them: copied into the new data directory's blob store.
    code, out, err = agora(
        "import", "demo", "-i", str(export), "--blobs", str(blobs), data=tmp_path / "full"
    )
    assert code == 0 and "1 blob(s) copied" in out and "warning" not in err
    assert (tmp_path / "full" / "blobs" / sha[:2] / sha[2:]).read_bytes() == b"x" * 100_000
    code, _, err = agora("import", "demo", "-i", str(export), "--blobs", str(tmp_path / "nope"))
    assert code == 1 and "no blob directory" in err


def test_an_import_refused_or_cut_leaves_none_of_the_blobs_it_copied(
    agora: Agora, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--blobs`` copies the content before the events: each blob under the intent of its
    first event, like every writer's (hub.log.intents). An import refused after the copy (a
    broken chain) removes them at once; one cut by a crash leaves them to the sweep."""
    big = base64.b64encode(b"y" * 100_000).decode()
    agora.ok(
        "append",
        "demo",
        stdin=jsonl(
            {"kind": "fileWritten", "payload": {"path": "big.bin", "base64": big}},
            {"kind": "messagePosted", "payload": {"text": "after the blob"}},
        ),
    )
    export, blobs = tmp_path / "demo.jsonl", tmp_path / "blobs"
    assert agora("export", "demo", "-o", str(export), "--blobs", str(blobs))[0] == 0
    lines = export.read_text().splitlines()
    sha = json.loads(lines[0])["payload"]["blob"]
    broken = json.loads(lines[1])
    broken["payload"]["text"] = "edited"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join([lines[0], json.dumps(broken)]) + "\n")

    refused = tmp_path / "refused"
    code, _, err = agora("import", "demo", "-i", str(tampered), "--blobs", str(blobs), data=refused)
    assert code == 1 and "hash does not match" in err
    assert not (refused / "blobs" / sha[:2] / sha[2:]).exists()
    assert not any((refused / "blobs" / ".intents").iterdir())

    class Crash(BaseException):
        """The process dying in the import."""

    async def die(*args: object, **kwargs: object) -> int:
        raise Crash

    cut = tmp_path / "cut"
    with monkeypatch.context() as m:
        m.setattr(SqliteEventStore, "import_events", die)
        with pytest.raises(Crash):
            main(["import", "demo", "-i", str(export), "--blobs", str(blobs), "--data", str(cut)])
    assert (cut / "blobs" / sha[:2] / sha[2:]).exists()  # copied before the crash

    async def sweep() -> int:
        async with open_store(None, cut) as store:
            return await Workspaces(store).sweep_orphans(before=math.inf)

    assert asyncio.run(sweep()) == 1
    assert not (cut / "blobs" / sha[:2] / sha[2:]).exists()

    full = tmp_path / "full"
    code, out, _ = agora("import", "demo", "-i", str(export), "--blobs", str(blobs), data=full)
    assert code == 0 and "1 blob(s) copied" in out
    assert not any((full / "blobs" / ".intents").iterdir())  # dropped once imported
    assert (full / "blobs" / sha[:2] / sha[2:]).read_bytes() == b"y" * 100_000


def test_import_refuses_an_event_over_max_event_bytes(agora: Agora, tmp_path: Path) -> None:
    """An export holding an event larger than the stored-event limit (a log written before
    the limit, or crafted with a valid chain) is refused by line, nothing imported: once
    stored, a reader with the default frame limit could never read past it (issue 11)."""
    from hub.core.events import MessagePayload, MessagePosted

    async def plant() -> None:
        async with open_store(None, agora.data) as store:  # the store itself has no limit
            await store.append("big", [MessagePosted(producer="a", payload=MessagePayload())])
            text = "x" * (2 * 1024 * 1024)
            big = MessagePosted(producer="a", payload=MessagePayload(text=text))
            await store.append("big", [big])

    asyncio.run(plant())
    exported = agora.ok("export", "big")
    fresh = tmp_path / "fresh"
    code, out, err = agora("import", "big", stdin=exported, data=fresh)
    assert code == 1 and out == "", err
    assert "line 2" in err and "tooLarge" in err, err
    assert not fresh.exists()  # refused before the store is opened: nothing written


def test_export_output_file_is_only_replaced_when_complete(demo: Agora, tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("previous\n")
    code, _, err = demo("export", "nope", "-o", str(target))
    assert code == 1 and "notFound" in err
    assert target.read_text() == "previous\n"
    assert list(tmp_path.glob(".out.jsonl.*")) == []
    code, _, err = demo("export", "demo", "-o", str(tmp_path / "no" / "dir" / "x.jsonl"))
    assert code == 1 and "error: unavailable: " in err


# -- workspaces ------------------------------------------------------------------------------


def test_workspaces_lists_heads(demo: Agora) -> None:
    demo.ok("append", "alpha", stdin=jsonl(MESSAGE))
    rows = json.loads(demo.ok("workspaces", "--json"))
    assert [(r["workspace"], r["head"]) for r in rows] == [("alpha", 1), ("demo", 4)]
    last = json.loads(demo.ok("replay", "demo", "--json").splitlines()[-1])
    assert rows[1]["hash"] == last["hash"]
    assert rows[1]["lastActivity"] == last["timestamp"]
    text = demo.ok("workspaces").splitlines()
    assert text[0].split() == ["WORKSPACE", "HEAD", "LAST", "ACTIVITY"]
    assert text[2].split() == ["demo", "4", format_time(last["timestamp"])]


def test_workspaces_empty(agora: Agora) -> None:
    agora.data.mkdir()
    assert agora.ok("workspaces") == ""
    assert agora.ok("workspaces", "--json") == "[]\n"


def test_bad_store_url_is_a_usage_error(demo: Agora) -> None:
    code, _, err = demo("workspaces", "--store", "nosuch://x")
    assert code == 2 and "unknown store URL scheme" in err


# -- the real console entry point ------------------------------------------------------------


def test_console_script_end_to_end(tmp_path: Path) -> None:
    data = str(tmp_path / "data")

    def agora(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hub", *argv, "--data", data],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
            check=False,
        )

    done = agora("append", "demo", stdin=jsonl(NEED, WRITE_1))
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["1", "2"]
    done = agora("replay", "demo")
    assert done.returncode == 0, done.stderr
    assert "fileWritten  src/app.py rev 1 (9 B)" in done.stdout
    done = agora("append", "demo", stdin='{"kind": "fileWritten", "payload": {"path": "/abs"}}\n')
    assert done.returncode == 1
    assert "agora append: error: badRequest: line 1: payload" in done.stderr
    done = agora("verify")
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "ok demo 2 events")
    exported = agora("export", "demo").stdout
    assert [msgspec.json.decode(line)["seq"] for line in exported.splitlines()] == [1, 2]
