"""The decide rules (hub/core/rules/decide.py)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.errors import AgoraError, Conflict, Forbidden, NotFound
from hub.core.events import (
    COLLABORATION_KINDS,
    Blocked,
    Completed,
    Event,
    ExecDisposed,
    ExecDisposedPayload,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MemberLeft,
    MemberPayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.projections.snapshots import encode_state
from hub.core.projections.workspace import WorkspaceState, evolve, rebuild
from hub.core.rules.decide import FILE_KINDS, decide, kinds_read, reads_state
from hub.core.rules.lifecycle import IllegalTransition
from tests.strategies import Draft, seal_all, valid_drafts


def _state(*drafts: Draft) -> WorkspaceState:
    return rebuild(seal_all(list(drafts)), "ws")


def _write(path: str, base_rev: int | None = None, text: str = "x") -> FileWritten:
    return FileWritten(payload=FileWrittenPayload(path=path, text=text, base_rev=base_rev))


def _delete(path: str, base_rev: int | None = None) -> FileDeleted:
    return FileDeleted(payload=FileDeletedPayload(path=path, base_rev=base_rev))


def _move(src: str, dst: str, base_rev: int | None = None) -> FileMoved:
    return FileMoved(payload=FileMovedPayload(from_=src, to=dst, base_rev=base_rev))


def _refused(
    state: WorkspaceState, drafts: Sequence[Event], producer: str, error: type[AgoraError]
) -> AgoraError:
    before = encode_state(state)
    with pytest.raises(error) as info:
        decide(state, drafts, producer)
    assert encode_state(state) == before, "decide must not mutate the state"
    return info.value


# -- files ------------------------------------------------------------------------------------


@pytest.fixture
def files() -> WorkspaceState:
    # a.txt at rev 2, b.txt at rev 1
    return _state(("alice", _write("a.txt")), ("bob", _write("a.txt")), ("bob", _write("b.txt")))


def test_writes_with_matching_or_absent_base_rev_pass(files: WorkspaceState) -> None:
    decide(files, [_write("a.txt", 2), _write("a.txt"), _write("new", 0), _write("b.txt", 1)], "c")


@pytest.mark.parametrize(
    ("path", "base_rev", "rev"), [("a.txt", 1, 2), ("a.txt", 3, 2), ("a.txt", 0, 2), ("new", 1, 0)]
)
def test_stale_base_rev_on_write_is_a_conflict(
    files: WorkspaceState, path: str, base_rev: int, rev: int
) -> None:
    err = _refused(files, [_write(path, base_rev)], "c", Conflict)
    assert err.details == {"path": path, "baseRev": base_rev, "rev": rev, "index": 0}
    assert path in err.message


def test_delete(files: WorkspaceState) -> None:
    decide(files, [_delete("a.txt"), _delete("b.txt", 1)], "c")
    err = _refused(files, [_delete("a.txt", 1)], "c", Conflict)
    assert err.details == {"path": "a.txt", "baseRev": 1, "rev": 2, "index": 0}
    err = _refused(files, [_delete("nope")], "c", NotFound)
    assert err.details == {"path": "nope", "index": 0}
    assert err.code == "notFound"
    _refused(files, [_delete("nope", 0)], "c", NotFound)


def test_move(files: WorkspaceState) -> None:
    decide(files, [_move("a.txt", "c.txt", 2), _move("b.txt", "d/b.txt")], "c")
    err = _refused(files, [_move("a.txt", "c.txt", 1)], "c", Conflict)
    assert err.details == {"path": "a.txt", "baseRev": 1, "rev": 2, "index": 0}
    err = _refused(files, [_move("nope", "c.txt")], "c", NotFound)
    assert err.details["path"] == "nope"
    err = _refused(files, [_move("a.txt", "b.txt")], "c", Conflict)
    assert err.details == {"path": "b.txt", "rev": 1, "index": 0}


def test_batches_see_earlier_drafts(files: WorkspaceState) -> None:
    decide(
        files,
        [
            _write("a.txt", 2),  # -> rev 3
            _write("a.txt", 3),  # -> rev 4
            _move("a.txt", "z.txt", 4),  # z.txt rev 5, a.txt gone
            _write("a.txt", 0),  # free again
            _delete("z.txt", 5),
            _move("b.txt", "z.txt", 1),  # z.txt free again
            _write("n", 0),
            _delete("n", 1),
        ],
        "c",
    )
    err = _refused(files, [_write("x", 0), _write("a.txt", 2), _write("x", 0)], "c", Conflict)
    assert err.details == {"path": "x", "baseRev": 0, "rev": 1, "index": 2}
    err = _refused(files, [_delete("a.txt"), _delete("a.txt")], "c", NotFound)
    assert err.details["index"] == 1
    err = _refused(files, [_move("a.txt", "q"), _write("q", 2)], "c", Conflict)
    assert err.details == {"path": "q", "baseRev": 2, "rev": 3, "index": 1}
    err = _refused(files, [_write("q"), _move("a.txt", "q")], "c", Conflict)
    assert err.details["index"] == 1


# -- work items -------------------------------------------------------------------------------


@pytest.fixture
def work() -> WorkspaceState:
    return _state(
        ("alice", NeedWork(correlation_id="open")),
        ("alice", NeedWork(correlation_id="owned")),
        ("bob", WorkClaimed(correlation_id="owned")),
        ("alice", NeedWork(correlation_id="done")),
        ("bob", Completed(correlation_id="done")),
        ("alice", NeedWork(correlation_id="gone")),
        ("alice", WorkCancelled(correlation_id="gone")),
    )


def test_claims(work: WorkspaceState) -> None:
    decide(work, [WorkClaimed(correlation_id="open")], "carol")
    decide(work, [WorkClaimed(correlation_id="owned")], "bob")  # re-claim by the owner
    err = _refused(work, [WorkClaimed(correlation_id="owned")], "carol", Conflict)
    assert err.details == {"correlationId": "owned", "owner": "bob", "index": 0}
    assert "bob" in err.message


@pytest.mark.parametrize("kind", [WorkPublished, Completed])
def test_publish_and_complete_are_for_the_owner(work: WorkspaceState, kind: type[Event]) -> None:
    decide(work, [kind(correlation_id="owned")], "bob")
    decide(work, [kind(correlation_id="open")], "carol")  # unowned: anyone
    err = _refused(work, [kind(correlation_id="owned")], "alice", Forbidden)
    assert err.details == {"correlationId": "owned", "owner": "bob", "index": 0}
    assert err.code == "forbidden"


@pytest.mark.parametrize("kind", [FeedbackRequested, FeedbackProvided, Blocked, NeedWork])
def test_other_kinds_are_for_anyone(work: WorkspaceState, kind: type[Event]) -> None:
    decide(work, [kind(correlation_id="owned")], "carol")


def test_cancel_only_by_requester_or_owner(work: WorkspaceState) -> None:
    decide(work, [WorkCancelled(correlation_id="owned")], "alice")
    decide(work, [WorkCancelled(correlation_id="owned")], "bob")
    decide(work, [WorkCancelled(correlation_id="open")], "alice")
    err = _refused(work, [WorkCancelled(correlation_id="owned")], "carol", Forbidden)
    assert err.details == {
        "correlationId": "owned",
        "requester": "alice",
        "owner": "bob",
        "index": 0,
    }
    _refused(work, [WorkCancelled(correlation_id="open")], "carol", Forbidden)


@pytest.mark.parametrize("cid", ["done", "gone"])
@pytest.mark.parametrize(
    "kind",
    [
        NeedWork,
        WorkClaimed,
        WorkPublished,
        FeedbackRequested,
        FeedbackProvided,
        Blocked,
        Completed,
        WorkCancelled,
    ],
)
def test_terminal_items_refuse_everything(
    work: WorkspaceState, cid: str, kind: type[Event]
) -> None:
    producer = "alice" if cid == "gone" else "bob"  # even the requester / owner
    err = _refused(work, [kind(correlation_id=cid)], producer, IllegalTransition)
    assert isinstance(err, Conflict)
    status = "completed" if cid == "done" else "cancelled"
    assert err.details == {
        "lifecycle": "work item",
        "state": status,
        "kind": kind.kind,
        "correlationId": cid,
        "index": 0,
    }
    assert status in err.message and kind.kind in err.message


def test_implicit_open_and_no_correlation(work: WorkspaceState) -> None:
    decide(
        work, [WorkPublished(correlation_id="fresh"), Completed(correlation_id="fresh")], "carol"
    )
    decide(work, [Completed(), Completed(), WorkClaimed()], "carol")  # no correlationId: no item


def test_work_batches_see_earlier_drafts(work: WorkspaceState) -> None:
    decide(
        work,
        [
            NeedWork(correlation_id="n"),
            WorkClaimed(correlation_id="n"),
            WorkPublished(correlation_id="n"),
            Completed(correlation_id="n"),
        ],
        "carol",
    )
    err = _refused(
        work,
        [
            WorkClaimed(correlation_id="open"),
            Completed(correlation_id="open"),
            Blocked(correlation_id="open"),
        ],
        "carol",
        IllegalTransition,
    )
    assert err.details["index"] == 2
    # claiming in the batch makes carol the owner, so she may then cancel (alone she may not)
    _refused(work, [WorkCancelled(correlation_id="open")], "carol", Forbidden)
    decide(
        work, [WorkClaimed(correlation_id="open"), WorkCancelled(correlation_id="open")], "carol"
    )


def test_claim_in_batch_sets_owner_and_implicit_requester() -> None:
    empty = WorkspaceState(workspace="ws")
    decide(
        empty,
        [
            WorkClaimed(correlation_id="c"),
            WorkPublished(correlation_id="c"),
            WorkCancelled(correlation_id="c"),
        ],
        "carol",
    )
    # a second claim by another producer in a later batch is refused
    state = _state(("carol", WorkClaimed(correlation_id="c")))
    _refused(state, [WorkClaimed(correlation_id="c")], "dave", Conflict)


def test_hub_kinds_are_not_checked() -> None:
    empty = WorkspaceState(workspace="ws")
    decide(
        empty,
        [
            ExecDisposed(payload=ExecDisposedPayload(exec_id="ghost")),
            MemberLeft(payload=MemberPayload(agent="ghost")),
            MessagePosted(),
        ],
        "anyone",
    )


# -- properties -------------------------------------------------------------------------------


@settings(max_examples=150)
@given(valid_drafts(max_size=50))
def test_every_generated_draft_is_accepted_alone_and_as_one_batch(drafts: list[Draft]) -> None:
    history = seal_all(drafts)
    state = WorkspaceState(workspace="ws")
    for (producer, draft), ev in zip(drafts, history, strict=True):
        decide(state, [draft], producer)
        evolve(state, ev)
    # the same history in batches (runs of one producer), each against the state before it
    state = WorkspaceState(workspace="ws")
    i = 0
    while i < len(drafts):
        j = i
        while j < len(drafts) and drafts[j][0] == drafts[i][0]:
            j += 1
        decide(state, [d for _, d in drafts[i:j]], drafts[i][0])
        for ev in history[i:j]:
            evolve(state, ev)
        i = j


@settings(max_examples=100)
@given(valid_drafts(max_size=40, min_size=1), st.data())
def test_a_stale_base_rev_anywhere_is_refused(drafts: list[Draft], data: st.DataObject) -> None:
    history = seal_all(drafts)
    files = [
        i for i, (_, d) in enumerate(drafts) if isinstance(d, FileWritten | FileDeleted | FileMoved)
    ]
    if not files:
        return
    i = data.draw(st.sampled_from(files))
    state = rebuild(history[:i], "ws")
    producer, draft = drafts[i]
    assert isinstance(draft, FileWritten | FileDeleted | FileMoved)
    path = draft.payload.from_ if isinstance(draft, FileMoved) else draft.payload.path
    current = state.files[path].rev if path in state.files else 0
    stale = data.draw(st.integers(0, current + 3).filter(lambda r: r != current))
    bad = msgspec.structs.replace(
        draft, payload=msgspec.structs.replace(draft.payload, base_rev=stale)
    )
    err = _refused(state, [MessagePosted(), bad], producer, Conflict)
    assert err.details == {"path": path, "baseRev": stale, "rev": current, "index": 1}


# -- reads_state: which batches may land after events they were not decided against --------


@given(valid_drafts(), valid_drafts())
@settings(max_examples=60, deadline=None)
def test_a_batch_that_reads_no_state_is_accepted_after_any_history(
    history: list[Draft], batch: list[Draft]
) -> None:
    """What ``reads_state`` calls state-free is decided the same whatever came before."""
    events = [draft for _, draft in batch]
    if not events or reads_state(events):
        return
    decide(_state(*history), events, "someone-else")


def _outcome(state: WorkspaceState, drafts: list[Event]) -> tuple[str, dict[str, object]] | None:
    try:
        decide(state, drafts, "p")
    except AgoraError as e:
        return type(e).__name__, e.details
    return None


@given(valid_drafts(), valid_drafts(), valid_drafts(min_size=1))
@settings(max_examples=80, deadline=None)
def test_events_of_kinds_a_batch_does_not_read_leave_its_decision_as_it_was(
    history: list[Draft], between: list[Draft], batch: list[Draft]
) -> None:
    """What the store relies on to append a decided batch after another node's events
    instead of refusing it (``EventStore.append``'s ``reads``): events of kinds outside
    ``kinds_read`` of the batch, appended after the state it was decided on, decide it the
    same way — accepted, or refused with the same error."""
    events = [draft for _, draft in batch]
    unread = [(who, d) for who, d in between if d.kind not in kinds_read(events)]
    assert _outcome(_state(*history), events) == _outcome(_state(*history, *unread), events)


@pytest.mark.parametrize(
    ("drafts", "expected"),
    [
        ([MessagePosted()], frozenset()),
        ([_write("a")], FILE_KINDS),
        ([_delete("a"), MessagePosted()], FILE_KINDS),
        ([WorkClaimed(correlation_id="c")], COLLABORATION_KINDS),
        ([NeedWork()], frozenset()),
        ([_move("a", "b"), Completed(correlation_id="c")], FILE_KINDS | COLLABORATION_KINDS),
    ],
)
def test_kinds_read(drafts: list[Event], expected: frozenset[str]) -> None:
    assert kinds_read(drafts) == expected


@pytest.mark.parametrize(
    ("drafts", "expected"),
    [
        ([MessagePosted()], False),
        ([_write("a")], True),  # a new path must keep the workspace a tree
        ([_write("a", base_rev=0)], True),
        ([_delete("a")], True),
        ([_move("a", "b")], True),
        ([NeedWork(correlation_id="c")], True),
        ([NeedWork()], False),  # no correlationId: no work item is touched
        ([MessagePosted(), WorkClaimed(correlation_id="c")], True),
    ],
)
def test_reads_state(drafts: list[Event], expected: bool) -> None:
    assert reads_state(drafts) is expected


# -- the workspace is a tree (issue 11) ---------------------------------------------------------


def test_a_file_cannot_become_a_directory() -> None:
    state = _state(("alice", _write("x")))
    error = _refused(state, [_write("x/y")], "bob", Conflict)
    assert error.details == {"path": "x/y", "clash": "x", "index": 0}
    _refused(state, [_write("x/y/z")], "bob", Conflict)


def test_a_directory_cannot_become_a_file() -> None:
    state = _state(("alice", _write("d/e/f.txt")))
    for path in ("d", "d/e"):
        error = _refused(state, [_write(path)], "bob", Conflict)
        assert error.details["clash"] == "d/e/f.txt" and error.details["path"] == path
    decide(state, [_write("d/e/g.txt"), _write("d/e/f.txt"), _write("dd")], "bob")  # siblings


def test_moves_keep_the_tree() -> None:
    state = _state(("alice", _write("x")), ("alice", _write("d/f")))
    assert _refused(state, [_move("x", "d")], "bob", Conflict).details["clash"] == "d/f"
    assert _refused(state, [_move("d/f", "x/f")], "bob", Conflict).details["clash"] == "x"


def test_the_tree_rule_sees_the_batch() -> None:
    state = _state(("alice", _write("x")))
    decide(state, [_delete("x"), _write("x/y")], "bob")  # x is gone first: now a directory
    decide(state, [_move("x", "z"), _write("x/y")], "bob")
    error = _refused(state, [_write("n/m"), _write("n")], "bob", Conflict)
    assert error.details == {"path": "n", "clash": "n/m", "index": 1}
    state2 = _state(("alice", _write("d/f")))
    decide(state2, [_delete("d/f"), _write("d")], "bob")  # the directory emptied in the batch
