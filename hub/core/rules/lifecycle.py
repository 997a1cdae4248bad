"""Lifecycles as transition tables (after h11's ``_state.py``). Pure.

A :class:`Lifecycle` is one table ``state -> kind -> next state``; the key ``None`` is the
pseudo-state "does not exist yet". A move the table lacks raises :class:`IllegalTransition`,
which names the lifecycle, the state and the event kind. The docs' diagrams are generated from
the same table (:meth:`Lifecycle.mermaid`), so the picture cannot drift from the code.

The work-item table lives in :mod:`hub.core.rules.work`, the execution table in
:mod:`hub.core.projections.executions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

from hub.core.errors import Conflict

S = TypeVar("S", bound=str)


class IllegalTransition(Conflict):
    """An event kind the lifecycle table does not allow in the current state.

    ``details``: ``lifecycle``, ``state`` (``None`` = does not exist yet), ``kind``, plus
    whatever the caller adds (``correlationId``, ``execId``, ``index``).
    """

    def __init__(self, lifecycle: str, state: str | None, kind: str, **details: Any) -> None:
        where = "does not exist yet" if state is None else f"is {state}"
        super().__init__(
            f"{kind} is not allowed: the {lifecycle} {where}",
            lifecycle=lifecycle,
            state=state,
            kind=kind,
            **details,
        )


class Lifecycle(Generic[S]):
    """One transition table with its name and its terminal states.

    ``table[state][kind]`` is the next state; ``None`` as a state means "not created yet".
    """

    __slots__ = ("name", "table", "terminal")

    def __init__(
        self, name: str, table: Mapping[S | None, Mapping[str, S]], terminal: frozenset[S]
    ) -> None:
        self.name: Final = name
        self.table: Final = table
        self.terminal: Final = terminal
        for state in terminal:
            if table.get(state):
                raise ValueError(f"terminal state {state!r} of {name} has outgoing moves")

    def next(self, state: S | None, kind: str, **details: Any) -> S:
        """The state after ``kind``. Raises :class:`IllegalTransition` (with ``details``)."""
        moves = self.table.get(state)
        nxt = None if moves is None else moves.get(kind)
        if nxt is None:
            raise IllegalTransition(self.name, state, kind, **details)
        return nxt

    def allows(self, state: S | None, kind: str) -> bool:
        moves = self.table.get(state)
        return moves is not None and kind in moves

    @property
    def states(self) -> list[S]:
        """Every state, in table order (targets that are not keys included)."""
        seen: dict[S, None] = {}
        for state, moves in self.table.items():
            if state is not None:
                seen[state] = None
            for nxt in moves.values():
                seen[nxt] = None
        return list(seen)

    @property
    def kinds(self) -> list[str]:
        seen: dict[str, None] = {}
        for moves in self.table.values():
            for kind in moves:
                seen[kind] = None
        return list(seen)

    def mermaid(self) -> str:
        """The table as a Mermaid ``stateDiagram-v2`` (moves between the same two states share
        one arrow; ``[*]`` is "not created yet" and the end after a terminal state)."""
        lines = ["stateDiagram-v2"]
        for state, moves in self.table.items():
            grouped: dict[str, list[str]] = {}
            for kind, nxt in moves.items():
                grouped.setdefault(nxt, []).append(kind)
            src = "[*]" if state is None else state
            for dst, kinds in grouped.items():
                lines.append(f"    {src} --> {dst} : {', '.join(kinds)}")
        for state in self.states:
            if state in self.terminal:
                lines.append(f"    {state} --> [*]")
        return "\n".join(lines) + "\n"
