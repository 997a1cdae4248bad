"""The event model: encoding round trips, adk-code compatibility, golden encodings.

The golden file ``tests/fixtures/events.jsonl`` holds one stored event of every kind, exactly as
a log stores it. Decoding and re-encoding must give the same bytes and the same hashes forever
(old logs must replay). To add a kind or field: append to ``GOLDEN`` below and regenerate with
``python -m tests.hub.test_events`` — lines already there must come out unchanged.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings

from hub.core.chain import compute_hash, verify_chain
from hub.core.events import (
    COLLABORATION_KINDS,
    EVENT_TYPES,
    HUB_KINDS,
    KINDS,
    OP_KINDS,
    ArtifactPayload,
    ArtifactPublished,
    ArtifactRef,
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
    SkippedWrite,
    TokenRevoked,
    TokenRevokedPayload,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
    decode_event,
    decode_events,
    encode_event,
    event_from_builtins,
    event_to_builtins,
)
from tests.strategies import Draft, seal_all, valid_histories
from tests.support.paths import DOCS_DIR, FIXTURES_DIR

FIXTURE = FIXTURES_DIR / "events.jsonl"
DOCS = DOCS_DIR / "events.md"
SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # sha256("test")

ADK_EVENT = (
    b'{"correlationId":"c","topic":"t","producer":"p","consumer":null,"kind":"needWork",'
    b'"payload":{"any":"json"},"timestamp":1712000000000}'
)

GOLDEN: list[Draft] = [
    (
        "alice",
        NeedWork(
            correlation_id="w1", topic="build", consumer="bob", payload={"want": "a parser", "n": 1}
        ),
    ),
    ("bob", WorkClaimed(correlation_id="w1", causation_id="ws-1", payload=None)),
    ("bob", FeedbackRequested(correlation_id="w1", payload={"question": "which grammar?"})),
    ("alice", FeedbackProvided(correlation_id="w1", payload="PEG")),
    ("bob", Blocked(correlation_id="w1", payload={"on": "review"})),
    ("bob", WorkPublished(correlation_id="w1", payload={"files": ["src/parser.py"]})),
    ("bob", Completed(correlation_id="w1", payload=[1, 2.5, True, None])),
    ("carol", WorkCancelled(correlation_id="w2", payload={"why": "duplicate"})),
    (
        "alice",
        MessagePosted(
            consumer="bob",
            payload=MessagePayload(
                text="héllo ✓", data={"parts": [{"kind": "text"}]}, media_type="text/plain"
            ),
        ),
    ),
    (
        "hub",
        MemberJoined(
            payload=MemberPayload(
                agent="dave", via="a2a", card_url="https://agents.example/dave.json"
            )
        ),
    ),
    ("hub", MemberLeft(payload=MemberPayload(agent="dave", via="a2a", reason="closed"))),
    (
        "alice",
        FileWritten(
            payload=FileWrittenPayload(
                path="src/parser.py",
                text="print('hi')\n",
                base_rev=0,
                sha256=SHA,
                size=12,
                media_type="text/x-python",
            )
        ),
    ),
    ("alice", FileDeleted(payload=FileDeletedPayload(path="old.txt", base_rev=3))),
    ("alice", FileMoved(payload=FileMovedPayload(from_="a.txt", to="b/a.txt", base_rev=1))),
    (
        "bob",
        ArtifactPublished(
            payload=ArtifactPayload(
                key="report",
                media_type="application/json",
                size_bytes=4,
                sha256=SHA,
                blob=SHA,
                exec_id="x1",
            )
        ),
    ),
    (
        "alice",
        ExecRequested(
            payload=ExecRequestedPayload(
                exec_id="x1",
                backend="wasm",
                language="wasm",
                module=ExecModuleRef(blob=SHA),
                argv=["--fast"],
                stdin=b"\x00\x01in",
                input={"k": [1]},
                env_keys=["HOME"],
                cwd="src",
                timeout_ms=5000,
                encoding="utf8",
                policy={"network": "disabled"},
            )
        ),
    ),
    (
        "alice",
        ExecCancelRequested(payload=ExecCancelRequestedPayload(exec_id="x1", reason="too slow")),
    ),
    (
        "hub",
        ExecStarted(
            payload=ExecStartedPayload(
                exec_id="x1", backend="wasm", isolation="in-process", node="node-a"
            )
        ),
    ),
    (
        "hub",
        ExecOutput(
            payload=ExecOutputPayload(exec_id="x1", stream="stderr", n=1, data=b"\xffbinary\n")
        ),
    ),
    (
        "hub",
        ExecFinished(
            payload=ExecFinishedPayload(
                exec_id="x1",
                status="cancelled",
                reason="killed",
                exit_code=130,
                value={"v": 1},
                stdout_truncated=True,
                duration_ms=12,
                pushed=2,
                pulled=1,
                skipped=[SkippedWrite(path="ro.txt", mount_root="/ws", op="write")],
                diagnostics=[{"level": "warning"}],
                artifacts=[ArtifactRef(key="report", size_bytes=4, sha256=SHA)],
            )
        ),
    ),
    ("hub", ExecDisposed(payload=ExecDisposedPayload(exec_id="x1"))),
    (
        "hub",
        TokenRevoked(
            payload=TokenRevokedPayload(
                token_id="jti-1", agent="mallory", before=1712000000, reason="leaked"
            )
        ),
    ),
    (
        "hub",
        PushAttempted(
            causation_id="e7",
            payload=PushAttemptedPayload(
                task_id="t1",
                config_id="c1",
                url="https://hooks.example/agora",
                seq=7,
                state="TASK_STATE_COMPLETED",
                attempt=2,
                outcome="retry",
                status=503,
                error="HTTP 503",
            ),
        ),
    ),
    (
        "erin",
        MemberLeft(
            payload=MemberPayload(agent="erin", reason="interrupted", node="node-a"),
        ),
    ),
]


def golden_events() -> list[Event]:
    return seal_all(GOLDEN, "golden")


def test_golden_encodings_are_stable() -> None:
    lines = FIXTURE.read_bytes().splitlines()
    events = [decode_event(line) for line in lines]
    assert {e.kind for e in events} == set(KINDS), "one golden event of every kind"
    for line, ev in zip(lines, events, strict=True):
        assert encode_event(ev) == line
        assert compute_hash(ev) == ev.hash, f"canonical encoding of {ev.kind} changed"
    assert verify_chain(events) == (len(events), None)
    # What the model builds today still encodes exactly as stored.
    assert [encode_event(e) for e in golden_events()] == lines


def test_kind_sets_are_consistent() -> None:
    assert set(KINDS) == {t.kind for t in EVENT_TYPES}
    assert len(KINDS) == len(EVENT_TYPES) == 23
    assert set(KINDS) >= COLLABORATION_KINDS | HUB_KINDS | OP_KINDS
    assert not (COLLABORATION_KINDS & HUB_KINDS) and not (HUB_KINDS & OP_KINDS)
    for t in EVENT_TYPES:  # tags are explicit strings, never derived from class names
        assert t.__struct_config__.tag == t.kind


def test_docs_cover_every_kind_and_payload_field() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for kind, t in KINDS.items():
        assert f"`{kind}`" in docs, kind
        payload = {f.name: f for f in msgspec.structs.fields(t)}["payload"].type
        if isinstance(payload, type) and issubclass(payload, msgspec.Struct):
            for f in msgspec.structs.fields(payload):
                assert f"| `{f.encode_name}` |" in docs, f"{kind}.payload.{f.encode_name}"


def test_adk_code_collaboration_event_decodes_as_is() -> None:
    ev = decode_event(ADK_EVENT)
    assert isinstance(ev, NeedWork)
    assert ev.correlation_id == "c"
    assert ev.topic == "t"
    assert ev.producer == "p"
    assert ev.consumer is None
    assert ev.payload == {"any": "json"}
    assert ev.timestamp == 1712000000000
    assert decode_event(encode_event(ev)) == ev


def test_unknown_fields_are_ignored_when_reading() -> None:
    ev = decode_event(
        b'{"kind":"messagePosted","seq":3,"futureField":[1],"payload":{"text":"x","alsoNew":true}}'
    )
    assert isinstance(ev, MessagePosted)
    assert ev.seq == 3 and ev.payload.text == "x"


def test_unknown_kind_and_wrong_types_are_rejected() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_event(b'{"kind":"nope"}')
    with pytest.raises(msgspec.ValidationError):
        decode_event(b'{"kind":"fileWritten","payload":{"path":7}}')
    with pytest.raises(msgspec.DecodeError):
        decode_event(b"{not json")


def test_defaults_are_omitted_and_keys_are_camel_case() -> None:
    ev = FileMoved(correlation_id="c", payload=FileMovedPayload(from_="a", to="b"))
    assert msgspec.json.decode(encode_event(ev)) == {
        "kind": "fileMoved",
        "correlationId": "c",
        "payload": {"from": "a", "to": "b"},
    }
    assert encode_event(MessagePosted()) == b'{"kind":"messagePosted"}'


def test_events_are_frozen() -> None:
    ev = NeedWork(id="a")
    with pytest.raises(AttributeError):
        ev.id = "b"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        MessagePayload(text="a").text = "b"  # type: ignore[misc]


@settings(max_examples=150)
@given(valid_histories(max_size=40))
def test_encoding_round_trips(history: list[Event]) -> None:
    for ev in history:
        data = encode_event(ev)
        assert decode_event(data) == ev
        assert decode_event(data.decode()) == ev
        assert event_from_builtins(event_to_builtins(ev)) == ev
    blob = b"[" + b",".join(encode_event(e) for e in history) + b"]"
    assert decode_events(blob) == history


if __name__ == "__main__":  # python -m tests.hub.test_events: rewrite the golden file
    FIXTURE.write_bytes(b"".join(encode_event(e) + b"\n" for e in golden_events()))
    print(f"wrote {FIXTURE}")
