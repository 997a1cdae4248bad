"""hub/core/rules/recovery.py: one rule closes an interrupted execution, whoever applies it."""

from __future__ import annotations

import msgspec

from hub.core.events import (
    Event,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    encode_event,
)
from hub.core.rules.recovery import (
    OpenExecution,
    closing_event_id,
    interrupted_drafts,
    left_open,
    node_death_interruption,
    open_execution,
    restart_interruption,
)


def run(*, started: bool = True, next_n: int | None = 4) -> OpenExecution:
    return OpenExecution(
        workspace="w", exec_id="e", started=started, seq=7, event_id="start-id", next_n=next_n
    )


def test_a_started_run_gets_a_note_then_the_failed_interrupted_finish() -> None:
    note, finish = interrupted_drafts(run(), restart_interruption("node-b"))
    assert isinstance(note, ExecOutput) and isinstance(finish, ExecFinished)
    assert (note.payload.stream, note.payload.n) == ("stderr", 4)
    assert note.payload.data == b"interrupted when the hub restarted\n"
    payload = finish.payload
    assert (payload.status, payload.reason, payload.exit_code) == ("failed", "interrupted", -1)
    (diagnostic,) = payload.diagnostics
    assert diagnostic["code"] == "interrupted" and diagnostic["closedBy"] == "node-b"
    assert "node" not in diagnostic  # a restart does not know the node that ran it
    assert note.causation_id == finish.causation_id == "start-id"


def test_a_run_never_started_gets_no_note() -> None:
    (finish,) = interrupted_drafts(run(started=False), restart_interruption("n"))
    assert isinstance(finish, ExecFinished)


def test_the_diagnostic_says_whether_the_run_had_started() -> None:
    """A run accepted but never started did not run: its diagnostic says so, and does not
    say it was stopped while it ran (on either path)."""
    for why in (restart_interruption("b"), node_death_interruption("a", "b")):
        started = interrupted_drafts(run(), why)[-1]
        unstarted = interrupted_drafts(run(started=False), why)[-1]
        assert isinstance(started, ExecFinished) and isinstance(unstarted, ExecFinished)
        ran = started.payload.diagnostics[0]["message"]
        not_run = unstarted.payload.diagnostics[0]["message"]
        assert "before this started" in not_run and "did not run" in not_run
        assert "before this started" not in ran


def test_without_the_output_numbering_there_is_no_note() -> None:
    (finish,) = interrupted_drafts(run(next_n=None), node_death_interruption("dead", "alive"))
    assert isinstance(finish, ExecFinished)
    (diagnostic,) = finish.payload.diagnostics
    assert (diagnostic["node"], diagnostic["closedBy"]) == ("dead", "alive")


def test_both_paths_write_the_same_payload_shape() -> None:
    restart = interrupted_drafts(run(), restart_interruption("x"))[-1]
    death = interrupted_drafts(run(), node_death_interruption("d", "x"))[-1]
    assert isinstance(restart, ExecFinished) and isinstance(death, ExecFinished)
    a = msgspec.to_builtins(restart.payload)
    b = msgspec.to_builtins(death.payload)
    a_diag, b_diag = a.pop("diagnostics"), b.pop("diagnostics")
    assert a == b  # everything but the diagnostic's text and node
    assert set(b_diag[0]) - set(a_diag[0]) == {"node"}


def test_ids_are_derived_so_a_repeated_close_is_a_duplicate() -> None:
    first = interrupted_drafts(run(), restart_interruption("a"))
    again = interrupted_drafts(run(), restart_interruption("b"))
    assert [d.id for d in first] == [d.id for d in again]
    assert first[-1].id == closing_event_id("w", "e", 7)
    assert len({d.id for d in first}) == 2
    encode_event(first[-1])  # a valid draft


def lifecycle(workspace: str, seq: int, kind: str, exec_id: str, node: str | None = None) -> Event:
    """A stored lifecycle event (``seq`` set, as read from a log)."""
    event: Event
    if kind == "requested":
        event = ExecRequested(
            payload=ExecRequestedPayload(exec_id=exec_id, backend="sh", node=node)
        )
    elif kind == "started":
        event = ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="sh", node=node))
    else:
        event = ExecFinished(
            payload=ExecFinishedPayload(exec_id=exec_id, status="completed", reason="exit")
        )
    return msgspec.structs.replace(event, workspace=workspace, seq=seq, id=f"{workspace}-{seq}")


def test_a_dead_node_left_open_what_it_started_and_what_it_accepted_only() -> None:
    events = [
        lifecycle("w", 1, "requested", "a", "dead"),  # accepted, never started: open
        lifecycle("w", 2, "requested", "b", "dead"),
        lifecycle("w", 3, "started", "b", "dead"),  # started, not finished: open (its start)
        lifecycle("w", 4, "requested", "c", "dead"),
        lifecycle("w", 5, "finished", "c"),  # finished: not open
        lifecycle("w", 6, "requested", "d", "alive"),  # another node's: not open
        lifecycle("w", 7, "requested", "e"),  # names no node (an old log): not found
        lifecycle("w", 8, "requested", "f", "dead"),
        lifecycle("w", 9, "started", "f", "alive"),  # started elsewhere: not the dead one's
        lifecycle("v", 1, "requested", "a", "dead"),
    ]
    opened = left_open("dead", reversed(events))  # any order; by workspace and seq
    assert [(e.workspace, e.seq, e.kind) for e in opened] == [
        ("v", 1, "execRequested"),
        ("w", 1, "execRequested"),
        ("w", 3, "execStarted"),
    ]
    assert left_open("dead", events + events) == opened  # one seen twice counts once
    never, started = open_execution(opened[1]), open_execution(opened[2])
    assert (never.started, never.seq, never.event_id, never.next_n) == (False, 1, "w-1", None)
    assert (started.started, started.seq, started.event_id) == (True, 3, "w-3")
    (finish,) = interrupted_drafts(never, node_death_interruption("dead", "alive"))
    assert isinstance(finish, ExecFinished) and finish.causation_id == "w-1"
    assert finish.id == closing_event_id("w", "a", 1)  # as a restart derives it


def test_a_reused_id_is_judged_by_its_last_run() -> None:
    first_run = [
        lifecycle("w", 1, "requested", "a", "dead"),
        lifecycle("w", 2, "started", "a", "dead"),
        lifecycle("w", 3, "finished", "a"),
    ]
    again_here = [lifecycle("w", 4, "requested", "a", "dead")]
    # Another node's request of the id may be missing from what the caller read.
    again_elsewhere = [lifecycle("w", 5, "started", "a", "alive")]
    assert [e.seq for e in left_open("dead", first_run + again_here)] == [4]
    assert left_open("dead", first_run) == []
    assert left_open("dead", first_run + again_elsewhere) == []
