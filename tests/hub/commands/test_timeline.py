"""hub.commands.timeline: one-line summaries per kind, time and size formatting, the folding
Timeline."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.commands.timeline import (
    Timeline,
    format_line,
    format_size,
    format_time,
    parse_time,
    printable,
    summarize,
)
from hub.core.events import (
    KINDS,
    ArtifactPayload,
    ArtifactPublished,
    Blocked,
    Completed,
    Event,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
    ExecDisposed,
    ExecDisposedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecModuleRef,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    PushAttempted,
    PushAttemptedPayload,
    TokenRevoked,
    TokenRevokedPayload,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.projections.workspace import WorkspaceState

SHA = "ab" * 32


def stamp(ev: Event, seq: int = 1, producer: str = "alice") -> Event:
    return msgspec.structs.replace(ev, seq=seq, producer=producer, timestamp=1714564800123)


# -- time and size ---------------------------------------------------------------------------


def test_format_time_is_utc_iso_with_milliseconds() -> None:
    assert format_time(1714564800123) == "2024-05-01T12:00:00.123Z"
    assert format_time(0) == "1970-01-01T00:00:00.000Z"
    assert format_time(5) == "1970-01-01T00:00:00.005Z"
    assert format_time(2**62) == "@4611686018427387.904Z"  # out of range: never raises


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2024-05-01T12:00:00.123Z", 1714564800123),
        ("2024-05-01T12:00:00.123z", 1714564800123),
        ("2024-05-01T12:00:00.123", 1714564800123),  # no offset: UTC
        ("2024-05-01T14:00:00.123+02:00", 1714564800123),
        ("2024-05-01T12:00", 1714564800000),
        ("2024-05-01", 1714521600000),
        (" 2024-05-01 ", 1714521600000),
    ],
)
def test_parse_time(text: str, ms: int) -> None:
    assert parse_time(text) == ms


@pytest.mark.parametrize("text", ["", "yesterday", "2024-13-01", "12:00"])
def test_parse_time_refuses_naming_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="invalid time"):
        parse_time(text)


@given(st.integers(min_value=0, max_value=253402300799999))  # up to year 9999
def test_format_then_parse_time_round_trips(ms: int) -> None:
    assert parse_time(format_time(ms)) == ms


@given(
    st.datetimes(
        min_value=dt.datetime(1970, 1, 1),
        max_value=dt.datetime(9999, 12, 31),
        timezones=st.just(dt.UTC),
    )
)
def test_format_time_matches_datetime(moment: dt.datetime) -> None:
    moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    ms = (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)
    assert format_time(ms) == moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1229, "1.2 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (2048 * 1024**4, "2048.0 TiB"),
        (-1, "? B"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


# -- summaries -------------------------------------------------------------------------------

CASES: list[tuple[Event, str]] = [
    (
        NeedWork(correlation_id="c1", topic="build", payload={"title": "Build it"}),
        '#c1 build "Build it"',
    ),
    (WorkClaimed(correlation_id="c1"), "#c1"),
    (WorkPublished(correlation_id="c1", payload="done, see PR"), '#c1 "done, see PR"'),
    (
        FeedbackRequested(correlation_id="c1", consumer="bob", payload={"q": 1}),
        '#c1 → bob "{\\"q\\":1}"',
    ),
    (FeedbackProvided(correlation_id="c1", payload={"text": "lgtm"}), '#c1 "lgtm"'),
    (Blocked(correlation_id="c1", payload={"reason": "needs key"}), '#c1 "needs key"'),
    (Completed(correlation_id="c1", payload={}), "#c1"),
    (WorkCancelled(), ""),
    (MessagePosted(payload=MessagePayload(text="hi\nthere")), '"hi there"'),
    (MessagePosted(topic="t", payload=MessagePayload(data=[1, 2])), 't data "[1,2]"'),
    (MemberJoined(payload=MemberPayload(agent="bob", via="a2a")), "bob via a2a"),
    (MemberLeft(payload=MemberPayload(agent="bob", reason="timeout")), "bob (timeout)"),
    (
        FileWritten(payload=FileWrittenPayload(path="src/app.py", text="x", size=1229)),
        "src/app.py (1.2 KiB)",
    ),
    (FileWritten(payload=FileWrittenPayload(path="a", text="héllo")), "a (6 B)"),
    (FileWritten(payload=FileWrittenPayload(path="b", blob=SHA, size=2048)), "b (2.0 KiB, blob)"),
    (FileWritten(payload=FileWrittenPayload(path="c", blob=SHA)), "c (? B, blob)"),
    (FileDeleted(payload=FileDeletedPayload(path="old.txt")), "old.txt"),
    (FileMoved(payload=FileMovedPayload(from_="a", to="b")), "a → b"),
    (
        ArtifactPublished(
            payload=ArtifactPayload(
                key="report", media_type="text/html", size_bytes=10, exec_id="e1"
            )
        ),
        "report text/html (10 B) exec e1",
    ),
    (
        ExecRequested(
            payload=ExecRequestedPayload(
                exec_id="e1", backend="python", language="python", source="print(1)\nprint(2)"
            )
        ),
        'e1 on python python "print(1) print(2)"',
    ),
    (
        ExecRequested(
            payload=ExecRequestedPayload(
                exec_id="e2", backend="wasm", module=ExecModuleRef(blob=SHA), argv=["-v", "x"]
            )
        ),
        f'e2 on wasm module {SHA[:12]} argv "-v x"',
    ),
    (ExecCancelRequested(payload=ExecCancelRequestedPayload(exec_id="e1")), "e1"),
    (
        ExecStarted(payload=ExecStartedPayload(exec_id="e1", backend="process", isolation="netns")),
        "e1 on process (netns)",
    ),
    (
        ExecOutput(payload=ExecOutputPayload(exec_id="e1", stream="stderr", n=3, data=b"x" * 40)),
        "e1 stderr #3 (40 B)",
    ),
    (
        ExecFinished(
            payload=ExecFinishedPayload(
                exec_id="e1", status="completed", reason="exit", exit_code=0, duration_ms=12
            )
        ),
        "e1 completed exit 0 (12 ms)",
    ),
    (
        ExecFinished(
            payload=ExecFinishedPayload(
                exec_id="e1", status="failed", reason="timeout", duration_ms=30000
            )
        ),
        "e1 failed timeout exit -1 (30000 ms)",
    ),
    (ExecDisposed(payload=ExecDisposedPayload(exec_id="e1")), "e1"),
    (
        TokenRevoked(payload=TokenRevokedPayload(token_id="t1", reason="leaked")),
        'token t1 "leaked"',
    ),
    (
        PushAttempted(
            payload=PushAttemptedPayload(
                task_id="t1",
                config_id="c1",
                url="https://hooks.example/agora",
                seq=9,
                state="TASK_STATE_COMPLETED",
                attempt=2,
                outcome="retry",
                status=503,
                error="server error",
            )
        ),
        "task t1 TASK_STATE_COMPLETED (seq 9) to https://hooks.example/agora: retry HTTP 503, "
        'attempt 2 "server error"',
    ),
]


@pytest.mark.parametrize(("event", "summary"), CASES, ids=[e.kind for e, _ in CASES])
def test_summaries(event: Event, summary: str) -> None:
    assert summarize(event) == summary


def test_every_kind_has_a_summary_case() -> None:
    assert {e.kind for e, _ in CASES} == set(KINDS)


def test_summary_with_rev() -> None:
    ev = FileWritten(payload=FileWrittenPayload(path="src/app.py", text="x", size=1229))
    assert summarize(ev, rev=3) == "src/app.py rev 3 (1.2 KiB)"
    assert summarize(FileMoved(payload=FileMovedPayload(from_="a", to="b")), rev=4) == "a → b rev 4"


def test_long_text_is_cut() -> None:
    summary = summarize(NeedWork(payload="word " * 100))
    assert len(summary) == 62 and summary.endswith('…"')


def test_format_line() -> None:
    ev = stamp(NeedWork(correlation_id="c1", payload="go"), seq=17)
    assert format_line(ev) == '2024-05-01T12:00:00.123Z  seq 17  alice  needWork  #c1 "go"'
    ev = stamp(WorkCancelled(), producer="")
    assert format_line(ev) == "2024-05-01T12:00:00.123Z  seq 1  -  workCancelled"


def test_printable_escapes_control_characters() -> None:
    assert printable("plain") == "plain"
    assert printable("a\nb\x1b[31m\tc") == "a\\nb\\x1b[31m\\tc"


@given(st.text(), st.text(), st.text())
def test_lines_stay_one_printable_line(path: str, text: str, producer: str) -> None:
    events: list[Any] = [
        FileWritten(payload=FileWrittenPayload(path=path or "p", text=text)),
        MessagePosted(consumer=producer, payload=MessagePayload(text=text)),
        NeedWork(correlation_id=text, topic=path, payload={"title": text}),
        MemberJoined(payload=MemberPayload(agent=text, via=path)),
    ]
    for ev in events:
        line = format_line(stamp(ev, producer=producer))
        assert line.isprintable(), line


# -- the folding timeline ---------------------------------------------------------------------


def test_timeline_numbers_file_revisions() -> None:
    timeline = Timeline(WorkspaceState(workspace="w"))
    events = [
        FileWritten(payload=FileWrittenPayload(path="a", text="1")),
        FileWritten(payload=FileWrittenPayload(path="a", text="22")),
        FileMoved(payload=FileMovedPayload(from_="a", to="b")),
        FileDeleted(payload=FileDeletedPayload(path="b")),
        FileWritten(payload=FileWrittenPayload(path="b", text="333")),
        MessagePosted(payload=MessagePayload(text="hi")),
    ]
    lines = [timeline.line(stamp(ev, seq=i)) for i, ev in enumerate(events, start=1)]
    assert [line.split("  ", 4)[4] for line in lines] == [
        "a rev 1 (1 B)",
        "a rev 2 (2 B)",
        "a → b rev 3",
        "b",
        "b rev 1 (3 B)",
        '"hi"',
    ]
    assert timeline.state.seq == 6
    assert timeline.state.messages == 1


def test_timeline_can_start_mid_log() -> None:
    state = WorkspaceState(workspace="w")
    first = Timeline(state)
    first.line(stamp(FileWritten(payload=FileWrittenPayload(path="a", text="1")), seq=1))
    resumed = Timeline(state.clone())
    line = resumed.line(stamp(FileWritten(payload=FileWrittenPayload(path="a", text="2")), seq=2))
    assert line.endswith("a rev 2 (1 B)")
