"""hub.core.cursor: the reading position the fan-out and the log follower share."""

from __future__ import annotations

from hub.core.cursor import DUPLICATE, GAP, NEXT, SeqCursor


def test_steps() -> None:
    cursor = SeqCursor(5)
    assert [cursor.step(s) for s in (1, 5, 6, 7, 100)] == [DUPLICATE, DUPLICATE, NEXT, GAP, GAP]
    assert cursor.last == 5  # asking does not move it


def test_advance() -> None:
    cursor = SeqCursor()
    assert cursor.step(1) is NEXT
    cursor.advance(1)
    assert cursor.step(1) is DUPLICATE and cursor.step(2) is NEXT
    cursor.advance(9)  # a catch-up from the store may jump it
    assert cursor.last == 9 and cursor.step(10) is NEXT
    assert repr(cursor) == "SeqCursor(last=9)"
