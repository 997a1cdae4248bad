"""The execution lifecycle table and journal (hub/core/projections/executions.py)."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import given, settings

from hub.core.errors import Conflict
from hub.core.events import (
    Event,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
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
    MessagePosted,
)
from hub.core.projections import executions as journal_mod
from hub.core.projections.executions import (
    EXEC_LIFECYCLE,
    ExecJournal,
    exec_phase,
    exec_state_diagram,
    next_exec_phase,
    open_executions,
)
from hub.core.projections.workspace import rebuild
from hub.core.rules.lifecycle import IllegalTransition
from tests.strategies import Draft, seal_all, valid_histories
from tests.support.paths import DOCS_DIR

DOCS = DOCS_DIR / "events.md"


def _req(exec_id: str, backend: str = "process") -> ExecRequested:
    return ExecRequested(payload=ExecRequestedPayload(exec_id=exec_id, backend=backend, source="x"))


def _start(exec_id: str) -> ExecStarted:
    return ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="process"))


def _out(
    exec_id: str, n: int, data: bytes, stream: Literal["stdout", "stderr"] = "stdout"
) -> ExecOutput:
    return ExecOutput(payload=ExecOutputPayload(exec_id=exec_id, stream=stream, n=n, data=data))


def _fin(
    exec_id: str, status: Literal["completed", "failed", "cancelled"] = "completed", code: int = 0
) -> ExecFinished:
    return ExecFinished(
        payload=ExecFinishedPayload(exec_id=exec_id, status=status, reason="exit", exit_code=code)
    )


def _journal(*drafts: Draft) -> ExecJournal:
    return journal_mod.rebuild(seal_all(list(drafts)), "ws")


def test_table() -> None:
    assert set(EXEC_LIFECYCLE.kinds) == {
        "execRequested",
        "execCancelRequested",
        "execStarted",
        "execOutput",
        "execFinished",
        "execDisposed",
    }
    assert next_exec_phase(None, "execRequested", "x") == "requested"
    assert next_exec_phase("requested", "execStarted", "x") == "running"
    assert next_exec_phase("requested", "execCancelRequested", "x") == "requested"
    assert next_exec_phase("running", "execCancelRequested", "x") == "running"
    assert next_exec_phase("running", "execOutput", "x") == "running"
    assert next_exec_phase("requested", "execFinished", "x") == "finished"
    assert next_exec_phase("running", "execFinished", "x") == "finished"
    assert next_exec_phase("finished", "execDisposed", "x") == "disposed"
    assert next_exec_phase("disposed", "execRequested", "x") == "requested"


@pytest.mark.parametrize(
    ("phase", "kind"),
    [
        (None, "execStarted"),
        (None, "execOutput"),
        ("requested", "execRequested"),
        ("requested", "execOutput"),
        ("requested", "execDisposed"),
        ("running", "execStarted"),
        ("running", "execDisposed"),
        ("finished", "execCancelRequested"),
        ("finished", "execOutput"),
        ("finished", "execFinished"),
        ("finished", "execRequested"),
        ("disposed", "execDisposed"),
    ],
)
def test_illegal_moves_name_state_and_kind(phase: str | None, kind: str) -> None:
    with pytest.raises(IllegalTransition) as info:
        next_exec_phase(phase, kind, "x9")  # type: ignore[arg-type]
    assert isinstance(info.value, Conflict)
    assert kind in info.value.message
    assert ("does not exist yet" if phase is None else phase) in info.value.message
    assert info.value.details["execId"] == "x9"


def test_exec_phase() -> None:
    assert exec_phase("requested", False) == "requested"
    assert exec_phase("running", False) == "running"
    for status in ("completed", "failed", "cancelled"):
        assert exec_phase(status, False) == "finished"
        assert exec_phase(status, True) == "disposed"


def test_journal_records_everything() -> None:
    j = _journal(
        ("alice", _req("x")),
        ("hub", _start("x")),
        ("hub", _out("x", 1, b"he")),
        ("bob", MessagePosted()),
        ("hub", _out("x", 2, b"oops", "stderr")),
        ("hub", _out("x", 3, b"llo")),
        ("alice", ExecCancelRequested(payload=ExecCancelRequestedPayload(exec_id="x"))),
        ("hub", _fin("x", "cancelled", 130)),
    )
    assert j.seq == 8
    rec = j.executions["x"]
    assert (rec.status, rec.backend, rec.requested_by, rec.request_seq) == (
        "cancelled",
        "process",
        "alice",
        1,
    )
    assert rec.request is not None and rec.request.source == "x"
    assert rec.started_seq == 2 and rec.finished_seq == 8 and rec.cancel_requested
    assert [(c.stream, c.n, c.seq) for c in rec.output] == [
        ("stdout", 1, 3),
        ("stderr", 2, 5),
        ("stdout", 3, 6),
    ]
    assert rec.stream_bytes("stdout") == b"hello" and rec.stream_bytes("stderr") == b"oops"
    assert rec.result is not None and rec.result.exit_code == 130
    assert rec.phase == "finished" and not rec.disposed


def test_dispose_and_reuse_of_an_id() -> None:
    j = _journal(
        ("a", _req("x")),
        ("hub", _fin("x", "failed", 1)),
        ("hub", ExecDisposed(payload=ExecDisposedPayload(exec_id="x"))),
    )
    assert j.executions["x"].disposed and j.executions["x"].phase == "disposed"
    j2 = journal_mod.evolve(j, seal_all([("b", _req("x", "wasm"))], after_seq=3)[0])
    rec = j2.executions["x"]
    assert (rec.status, rec.backend, rec.requested_by, rec.output, rec.result) == (
        "requested",
        "wasm",
        "b",
        [],
        None,
    )


def test_out_of_table_events_are_ignored_by_the_fold() -> None:
    j = _journal(
        ("hub", _start("ghost")),
        ("hub", _out("ghost", 1, b"x")),
        ("a", _req("x")),
        ("hub", _out("x", 1, b"early")),  # before execStarted
        ("a", _req("x", "wasm")),  # id taken
        ("hub", ExecDisposed(payload=ExecDisposedPayload(exec_id="x"))),  # not finished
        ("hub", _start("x")),
        ("hub", _fin("x")),
        ("hub", _fin("x", "failed", 1)),  # already finished
    )
    assert list(j.executions) == ["x"]
    rec = j.executions["x"]
    assert (rec.status, rec.backend, rec.output, rec.disposed) == (
        "completed",
        "process",
        [],
        False,
    )
    assert rec.result is not None and rec.result.exit_code == 0


def test_open_executions() -> None:
    j = _journal(
        ("a", _req("done")),
        ("hub", _start("done")),
        ("hub", _fin("done")),
        ("a", _req("running")),
        ("hub", _start("running")),
        ("a", _req("queued")),
        ("a", _req("never")),
        ("hub", _fin("never", "failed", -1)),
    )
    assert open_executions(j) == ["running"]
    assert open_executions(j, include_requested=True) == ["running", "queued"]


def _model_phases(history: list[Event]) -> dict[str, str]:
    phases: dict[str, str] = {}
    for ev in history:
        p = getattr(ev, "payload", None)
        exec_id = getattr(p, "exec_id", None)
        if exec_id is None or ev.kind == "artifactPublished":
            continue
        phases[exec_id] = next_exec_phase(phases.get(exec_id), ev.kind, exec_id)  # type: ignore[arg-type]
    return phases


@settings(max_examples=150)
@given(valid_histories(max_size=60))
def test_journal_agrees_with_the_table_and_the_workspace(history: list[Event]) -> None:
    j = journal_mod.rebuild(history, "ws")
    live = ExecJournal(workspace="ws")
    for ev in history:
        journal_mod.evolve(live, ev)
    assert live == j
    assert {i: r.phase for i, r in j.executions.items()} == _model_phases(history)
    state = rebuild(history, "ws")
    assert {i: (s.status, s.disposed) for i, s in state.executions.items()} == {
        i: (r.status, r.disposed) for i, r in j.executions.items()
    }
    for rec in j.executions.values():
        assert [c.n for c in rec.output] == list(range(1, len(rec.output) + 1))


def test_diagram_is_in_the_docs() -> None:
    diagram = exec_state_diagram()
    assert "    running --> finished : execFinished" in diagram
    assert diagram in DOCS.read_text(encoding="utf-8"), (
        "docs/events.md is out of date: paste "
        "hub.core.projections.executions.exec_state_diagram() output"
    )
