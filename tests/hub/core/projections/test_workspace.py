"""The workspace fold (hub/core/projections/workspace.py)."""

from __future__ import annotations

import base64
import hashlib

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.chain import seal
from hub.core.events import (
    ArtifactPayload,
    ArtifactPublished,
    Blocked,
    Completed,
    Event,
    ExecDisposed,
    ExecDisposedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePosted,
    NeedWork,
    WorkClaimed,
    WorkPublished,
    encode_event,
)
from hub.core.projections.snapshots import decode_state, encode_state
from hub.core.projections.workspace import (
    ExecSummary,
    FileEntry,
    Member,
    WorkItem,
    WorkspaceState,
    evolve,
    fold,
    fold_stored,
    rebuild,
)
from hub.core.records import JoinedPage
from tests.strategies import Draft, file_content, seal_all, valid_drafts, valid_histories


def _state(*drafts: Draft) -> WorkspaceState:
    return rebuild(seal_all(list(drafts)), "ws")


def _write(path: str, text: str, base_rev: int | None = None) -> FileWritten:
    return FileWritten(payload=FileWrittenPayload(path=path, text=text, base_rev=base_rev))


def test_empty() -> None:
    s = rebuild([], "ws")
    assert s == WorkspaceState(workspace="ws")
    assert s.seq == 0 and s.files == {} and s.messages == 0


def test_file_revisions_moves_and_deletes() -> None:
    s = _state(
        ("alice", _write("a.txt", "one")),
        ("bob", _write("a.txt", "two", base_rev=1)),
        ("bob", FileMoved(payload=FileMovedPayload(from_="a.txt", to="b/a.txt", base_rev=2))),
        ("alice", _write("c.bin", "x")),
        ("alice", FileDeleted(payload=FileDeletedPayload(path="c.bin"))),
    )
    assert s.seq == 5
    assert list(s.files) == ["b/a.txt"]
    entry = s.files["b/a.txt"]
    assert entry == FileEntry(
        rev=3,
        sha256=hashlib.sha256(b"two").hexdigest(),
        size=3,
        producer="bob",
        seq=3,
        text="two",
    )
    # written again after a delete: the counter starts over
    s2 = _state(
        ("alice", _write("c", "x")),
        ("alice", FileDeleted(payload=FileDeletedPayload(path="c"))),
        ("alice", _write("c", "y")),
    )
    assert s2.files["c"].rev == 1


def test_missing_sha256_and_size_are_computed() -> None:
    raw = b"\x00\xffbytes"
    ev = FileWritten(
        seq=1,
        producer="p",
        payload=FileWrittenPayload(path="b", base64=base64.b64encode(raw).decode()),
    )
    s = evolve(WorkspaceState(workspace="ws"), ev)
    assert s.files["b"].sha256 == hashlib.sha256(raw).hexdigest()
    assert s.files["b"].size == len(raw)
    assert s.files["b"].base64 == base64.b64encode(raw).decode()
    text = FileWritten(seq=2, payload=FileWrittenPayload(path="t", text="é"))
    evolve(s, text)
    assert (s.files["t"].sha256, s.files["t"].size) == (hashlib.sha256("é".encode()).hexdigest(), 2)
    blob = FileWritten(seq=3, payload=FileWrittenPayload(path="big", blob="c" * 64))
    evolve(s, blob)
    assert (s.files["big"].sha256, s.files["big"].size, s.files["big"].blob) == (
        "c" * 64,
        -1,
        "c" * 64,
    )
    # filled values are kept as the hub wrote them
    filled = FileWritten(
        seq=4, payload=FileWrittenPayload(path="f", blob="d" * 64, sha256="d" * 64, size=70000)
    )
    assert evolve(s, filled).files["f"].size == 70000


def test_moves_and_deletes_of_missing_files_are_ignored() -> None:
    s = _state(
        ("a", FileDeleted(payload=FileDeletedPayload(path="nope"))),
        ("a", FileMoved(payload=FileMovedPayload(from_="nope", to="x"))),
    )
    assert s.files == {} and s.seq == 2
    # a move onto an existing file (decide refuses it; a fold must still take it)
    s = _state(
        ("a", _write("x", "1")),
        ("a", _write("x", "2")),
        ("a", _write("x", "3")),
        ("a", _write("y", "1")),
        ("b", FileMoved(payload=FileMovedPayload(from_="y", to="x"))),
    )
    assert list(s.files) == ["x"] and s.files["x"].rev == 4 and s.files["x"].text == "1"


def test_members() -> None:
    s = _state(
        ("hub", MemberJoined(payload=MemberPayload(agent="alice"))),
        ("hub", MemberJoined(payload=MemberPayload(agent="bob", via="a2a", card_url="u"))),
        ("hub", MemberLeft(payload=MemberPayload(agent="alice"))),
        ("hub", MemberLeft(payload=MemberPayload(agent="ghost"))),
    )
    assert s.members == {
        "alice": Member(present=False, joined_seq=1, via="websocket"),
        "bob": Member(present=True, joined_seq=2, via="a2a", card_url="u"),
        "ghost": Member(present=False, joined_seq=0),
    }
    rejoined = evolve(
        s, seal_all([("hub", MemberJoined(payload=MemberPayload(agent="alice")))], after_seq=4)[0]
    )
    assert rejoined.members["alice"] == Member(present=True, joined_seq=5)


def test_artifacts_and_messages() -> None:
    s = _state(
        ("a", MessagePosted()),
        (
            "b",
            ArtifactPublished(
                payload=ArtifactPayload(
                    key="r", blob="e" * 64, sha256="e" * 64, size_bytes=9, exec_id="x"
                )
            ),
        ),
        ("a", MessagePosted()),
    )
    assert s.messages == 2
    art = s.artifacts["r"]
    assert (art.blob, art.size_bytes, art.producer, art.seq, art.exec_id) == (
        "e" * 64,
        9,
        "b",
        2,
        "x",
    )


def test_work_items() -> None:
    s = _state(
        ("alice", NeedWork(correlation_id="w", topic="build", consumer="bob")),
        ("bob", WorkClaimed(correlation_id="w", topic="other")),
        ("bob", WorkPublished(correlation_id="w")),
        ("carol", Blocked(correlation_id="v")),  # opened implicitly
        ("carol", Blocked()),  # no correlationId: no work item
        ("bob", Completed(correlation_id="w")),
    )
    assert s.work_items == {
        "w": WorkItem(
            status="completed",
            requester="alice",
            owner="bob",
            consumer="bob",
            topic="build",
            opened_seq=1,
            updated_seq=6,
            last_kind="completed",
            last_producer="bob",
        ),
        "v": WorkItem(
            status="blocked",
            requester="carol",
            opened_seq=4,
            updated_seq=4,
            last_kind="blocked",
            last_producer="carol",
        ),
    }


def test_illegal_work_moves_in_the_log_are_folded_leniently() -> None:
    s = _state(
        ("alice", Completed(correlation_id="w")),
        ("bob", WorkClaimed(correlation_id="w")),  # out of a terminal state: not in the table
    )
    item = s.work_items["w"]
    assert item.status == "completed" and item.owner is None
    assert (item.updated_seq, item.last_kind, item.last_producer) == (2, "workClaimed", "bob")


def test_executions() -> None:
    s = _state(
        ("alice", ExecRequested(payload=ExecRequestedPayload(exec_id="x", backend="process"))),
        ("hub", ExecStarted(payload=ExecStartedPayload(exec_id="x", backend="process"))),
        (
            "hub",
            ExecOutput(payload=ExecOutputPayload(exec_id="x", stream="stdout", n=1, data=b"hi")),
        ),
    )
    assert s.executions == {
        "x": ExecSummary(status="running", backend="process", requested_by="alice")
    }
    s = evolve(
        s,
        seal_all(
            [
                (
                    "hub",
                    ExecFinished(
                        payload=ExecFinishedPayload(
                            exec_id="x", status="failed", reason="timeout", exit_code=-1
                        )
                    ),
                )
            ],
            after_seq=3,
        )[0],
    )
    assert s.executions["x"] == ExecSummary(
        status="failed", backend="process", requested_by="alice", reason="timeout", exit_code=-1
    )
    s = evolve(
        s,
        seal_all([("hub", ExecDisposed(payload=ExecDisposedPayload(exec_id="x")))], after_seq=4)[0],
    )
    assert s.executions["x"].disposed
    again = seal_all(
        [("bob", ExecRequested(payload=ExecRequestedPayload(exec_id="x", backend="wasm")))],
        after_seq=5,
    )
    assert evolve(s, again[0]).executions["x"] == ExecSummary(
        status="requested", backend="wasm", requested_by="bob"
    )


def test_clone_is_independent() -> None:
    s = _state(
        ("alice", _write("a", "1")),
        ("alice", NeedWork(correlation_id="w")),
        ("alice", ExecRequested(payload=ExecRequestedPayload(exec_id="x", backend="process"))),
    )
    kept = s.clone()
    assert kept == s
    before = encode_state(kept)
    more = seal_all(
        [
            ("bob", _write("a", "2")),
            ("bob", WorkClaimed(correlation_id="w")),
            ("hub", ExecStarted(payload=ExecStartedPayload(exec_id="x", backend="process"))),
            ("bob", MessagePosted()),
        ],
        after_seq=3,
    )
    fold(s, more)
    assert s != kept
    assert encode_state(kept) == before


def test_state_json_is_camel_case() -> None:
    s = _state(
        ("alice", NeedWork(correlation_id="w")),
        ("hub", MemberJoined(payload=MemberPayload(agent="a"))),
    )
    doc = msgspec.json.decode(msgspec.json.encode(s))
    assert set(doc) == {
        "workspace",
        "seq",
        "files",
        "artifacts",
        "members",
        "workItems",
        "executions",
        "messages",
    }
    assert "openedSeq" in doc["workItems"]["w"] and "joinedSeq" in doc["members"]["a"]


def _model_files(history: list[Event]) -> dict[str, tuple[int, bytes | None]]:
    """An independent model of the files: path -> (rev, content or None for blobs)."""
    files: dict[str, tuple[int, bytes | None]] = {}
    for ev in history:
        match ev:
            case FileWritten(payload=p):
                rev = files[p.path][0] + 1 if p.path in files else 1
                files[p.path] = (rev, file_content(p))
            case FileDeleted(payload=p):
                del files[p.path]
            case FileMoved(payload=p):
                rev, content = files.pop(p.from_)
                files[p.to] = (rev + 1, content)
            case _:
                pass
    return files


@settings(max_examples=150)
@given(valid_histories(max_size=60), st.data())
def test_live_equals_rebuild_equals_snapshot_plus_tail(
    history: list[Event], data: st.DataObject
) -> None:
    live = WorkspaceState(workspace="ws")
    versions = [live.clone()]
    for ev in history:
        live = evolve(live, ev)
        versions.append(live.clone())
    assert live == rebuild(history, "ws")
    assert live.seq == len(history)
    cut = data.draw(st.integers(0, len(history)), label="snapshot seq")
    snap = decode_state(encode_state(versions[cut]))
    assert snap == rebuild(history[:cut], "ws")
    assert fold(snap, history[cut:]) == live
    # the files agree with an independent model
    model = _model_files(history)
    assert {p: e.rev for p, e in live.files.items()} == {p: r for p, (r, _) in model.items()}
    for path, (_, content) in model.items():
        if content is not None:
            entry = live.files[path]
            assert (entry.sha256, entry.size) == (hashlib.sha256(content).hexdigest(), len(content))
    assert live.messages == sum(isinstance(e, MessagePosted) for e in history)


# ---------------------------------------------------------------------------------------------
# fold_stored: the replay path (pages of stored bytes, decoded as views) folds to the same state


def _joined(events: list[Event], after_seq: int = 0) -> JoinedPage:
    return JoinedPage(
        body=b"[" + b",".join(map(encode_event, events)) + b"]",
        count=len(events),
        last_seq=events[-1].seq if events else after_seq,
    )


def _fold_pages(history: list[Event], cuts: list[int]) -> WorkspaceState:
    state = WorkspaceState(workspace="ws")
    start = 0
    for end in [*sorted(cuts), len(history)]:
        assert fold_stored(state, _joined(history[start:end], after_seq=state.seq))
        start = end
    return state


@st.composite
def _lenient_histories(draw: st.DrawFn) -> list[Event]:
    """Histories no hub writes but a log may hold (an import): valid drafts in any order,
    so moves, deletes, work-item and execution steps arrive in illegal places, and
    ``fileWritten`` events with or without the ``sha256``/``size`` the hub fills."""
    drafts = draw(st.permutations(draw(valid_drafts(max_size=40))))
    filled = {ev.id: ev for ev in seal_all(drafts)}
    out: list[Event] = []
    prev = ""
    for seq, (producer, draft) in enumerate(drafts, start=1):
        if isinstance(draft, FileWritten) and draw(st.booleans()):
            draft = filled[f"ws-{seq}"]  # with the digest the hub fills
        ev = seal(
            draft,
            id=f"ws-{seq}",
            workspace="ws",
            seq=seq,
            position=seq,
            timestamp=seq,
            producer=producer,
            prev=prev,
        )
        prev = ev.hash or ""
        out.append(ev)
    return out


@settings(max_examples=150)
@given(valid_histories(max_size=60), st.data())
def test_folding_stored_pages_equals_folding_events(
    history: list[Event], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(history)), max_size=4), label="page ends")
    assert _fold_pages(history, cuts) == rebuild(history, "ws")


@settings(max_examples=150)
@given(_lenient_histories(), st.data())
def test_folding_stored_pages_equals_folding_events_on_lenient_logs(
    history: list[Event], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(history)), max_size=4), label="page ends")
    assert _fold_pages(history, cuts) == rebuild(history, "ws")


def test_a_stored_page_is_folded_whole_or_not_at_all() -> None:
    history = seal_all(
        [("alice", _write("a.txt", "one")), ("bob", MessagePosted()), ("bob", _write("b", "2"))]
    )
    state = rebuild(history[:1], "ws")
    before = state.clone()
    good = _joined(history[1:])
    refused = [
        msgspec.structs.replace(good, body=good.body[:-9]),  # not JSON
        msgspec.structs.replace(good, body=good.body.replace(b"fileWritten", b"fileWrote")),
        msgspec.structs.replace(good, count=3),  # the store counted more
        msgspec.structs.replace(good, last_seq=4),  # ... or another last seq
        _joined(history),  # seq 1 is already folded
        _joined([history[2], history[1]]),  # out of order
        msgspec.structs.replace(_joined([history[1], history[1]]), last_seq=2),  # twice
    ]
    for page in refused:
        assert not fold_stored(state, page), page
        assert state == before
    assert fold_stored(state, good)
    assert state == rebuild(history, "ws")
    assert fold_stored(state, _joined([], after_seq=3)) and state == rebuild(history, "ws")
