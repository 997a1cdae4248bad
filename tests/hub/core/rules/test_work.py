"""The work-item lifecycle table (hub/core/rules/work.py) and its diagram in docs/events.md."""

from __future__ import annotations

import pytest

from hub.core.errors import Conflict
from hub.core.events import COLLABORATION_KINDS
from hub.core.rules.lifecycle import IllegalTransition
from hub.core.rules.work import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    WORK_LIFECYCLE,
    next_work_status,
    work_state_diagram,
)
from tests.support.paths import DOCS_DIR

DOCS = DOCS_DIR / "events.md"


def test_table_covers_the_collaboration_kinds() -> None:
    assert set(WORK_LIFECYCLE.kinds) == COLLABORATION_KINDS
    assert set(WORK_LIFECYCLE.states) == set(ACTIVE_STATUSES) | TERMINAL_STATUSES


@pytest.mark.parametrize("kind", sorted(COLLABORATION_KINDS))
def test_any_kind_opens_an_item(kind: str) -> None:
    assert next_work_status(None, kind, "c") in WORK_LIFECYCLE.states


def test_the_happy_path() -> None:
    status = None
    seen = []
    for kind in (
        "needWork",
        "workClaimed",
        "feedbackRequested",
        "feedbackProvided",
        "blocked",
        "workPublished",
        "completed",
    ):
        status = next_work_status(status, kind, "c")
        seen.append(status)
    assert seen == [
        "requested",
        "claimed",
        "feedbackRequested",
        "inProgress",
        "blocked",
        "published",
        "completed",
    ]


@pytest.mark.parametrize("status", ACTIVE_STATUSES)
def test_active_items_allow_every_kind_and_keep_status_on_repeated_need_work(status: str) -> None:
    for kind in COLLABORATION_KINDS:
        assert WORK_LIFECYCLE.allows(status, kind)  # type: ignore[arg-type]
    assert next_work_status(status, "needWork", "c") == status  # type: ignore[arg-type]


@pytest.mark.parametrize("status", sorted(TERMINAL_STATUSES))
@pytest.mark.parametrize("kind", sorted(COLLABORATION_KINDS))
def test_terminal_statuses_refuse_everything(status: str, kind: str) -> None:
    with pytest.raises(IllegalTransition) as info:
        next_work_status(status, kind, "c-1")  # type: ignore[arg-type]
    err = info.value
    assert isinstance(err, Conflict) and err.code == "conflict"
    assert status in err.message and kind in err.message
    assert err.details == {
        "lifecycle": "work item",
        "state": status,
        "kind": kind,
        "correlationId": "c-1",
    }


def test_unknown_kind_is_illegal_even_when_new() -> None:
    with pytest.raises(IllegalTransition, match="messagePosted"):
        next_work_status(None, "messagePosted", "c")


def test_diagram_is_generated_from_the_table_and_is_in_the_docs() -> None:
    diagram = work_state_diagram()
    assert diagram.startswith("stateDiagram-v2\n")
    for state, moves in WORK_LIFECYCLE.table.items():
        src = "[*]" if state is None else state
        for kind, nxt in moves.items():
            line = next(
                ln for ln in diagram.splitlines() if ln.startswith(f"    {src} --> {nxt} :")
            )
            assert kind in line
    assert "    completed --> [*]" in diagram and "    cancelled --> [*]" in diagram
    assert diagram in DOCS.read_text(encoding="utf-8"), (
        "docs/events.md is out of date: paste hub.core.rules.work.work_state_diagram() output"
    )
