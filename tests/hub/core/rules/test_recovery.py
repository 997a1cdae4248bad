"""hub/core/rules/recovery.py: one rule closes an interrupted execution, whoever applies it."""

from __future__ import annotations

import msgspec

from hub.core.events import ExecFinished, ExecOutput, encode_event
from hub.core.rules.recovery import (
    OpenExecution,
    closing_event_id,
    interrupted_drafts,
    node_death_interruption,
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
