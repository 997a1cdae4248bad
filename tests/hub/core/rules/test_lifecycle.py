"""Lifecycles as transition tables (hub/core/rules/lifecycle.py), on a small table of its own:
moves, refusals that name the lifecycle, state and kind, terminal states, the Mermaid diagram."""

from __future__ import annotations

from typing import Literal

import pytest

from hub.core.errors import Conflict
from hub.core.rules.lifecycle import IllegalTransition, Lifecycle

Door = Literal["closed", "open", "gone"]

DOOR: Lifecycle[Door] = Lifecycle(
    "door",
    {
        None: {"built": "closed"},
        "closed": {"opened": "open", "removed": "gone"},
        "open": {"closed": "closed", "slammed": "closed"},
    },
    terminal=frozenset({"gone"}),
)


def test_moves_follow_the_table() -> None:
    assert DOOR.next(None, "built") == "closed"
    assert DOOR.next("closed", "opened") == "open"
    assert DOOR.next("open", "slammed") == "closed"
    assert DOOR.allows("closed", "removed") and not DOOR.allows("open", "removed")
    assert not DOOR.allows("gone", "opened")  # a terminal state has no moves


@pytest.mark.parametrize(
    ("state", "kind", "where"),
    [
        (None, "opened", "does not exist yet"),
        ("open", "removed", "is open"),
        ("gone", "built", "is gone"),
    ],
)
def test_a_missing_move_is_an_illegal_transition(state: Door | None, kind: str, where: str) -> None:
    with pytest.raises(IllegalTransition) as refused:
        DOOR.next(state, kind, index=2)
    error = refused.value
    assert isinstance(error, Conflict)  # the wire code is ``conflict``
    assert error.message == f"{kind} is not allowed: the door {where}"
    assert error.details == {"lifecycle": "door", "state": state, "kind": kind, "index": 2}


def test_a_terminal_state_with_moves_is_refused() -> None:
    with pytest.raises(ValueError, match="terminal state 'open' of door"):
        Lifecycle("door", {None: {"built": "open"}, "open": {"x": "open"}}, frozenset({"open"}))


def test_states_and_kinds_in_table_order() -> None:
    assert DOOR.states == ["closed", "open", "gone"]
    assert DOOR.kinds == ["built", "opened", "removed", "closed", "slammed"]


def test_the_diagram_shares_arrows_and_ends_terminal_states() -> None:
    assert DOOR.mermaid() == (
        "stateDiagram-v2\n"
        "    [*] --> closed : built\n"
        "    closed --> open : opened\n"
        "    closed --> gone : removed\n"
        "    open --> closed : closed, slammed\n"
        "    gone --> [*]\n"
    )
