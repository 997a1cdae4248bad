"""Retention of finished executions (seed 003): which ones to prune. Pure.

A finished execution keeps its id (a new ``exec`` with it is ``exists``) and its journal until
it is disposed. The runtime prunes on its own those finished more than ``window_ms`` ago
(60 min) **beyond the newest** ``keep`` (100) finished ones of the workspace: the newest
``keep`` stay whatever their age, and so does anything younger than the window. Pruning appends
``execDisposed {reason: "retention"}``, like a ``dispose`` would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from hub.core.execution.settings import RuntimeSettings

__all__ = ["DEFAULT_KEEP", "DEFAULT_WINDOW_MS", "Finished", "prunable"]

DEFAULT_KEEP: Final = RuntimeSettings().retention_keep
DEFAULT_WINDOW_MS: Final = RuntimeSettings().retention_window_ms


class Finished(msgspec.Struct, frozen=True):
    """A finished, not yet disposed execution: its id, the seq and time (epoch ms) of its
    ``execFinished``."""

    exec_id: str
    finished_seq: int
    finished_at: int


def prunable(
    finished: Iterable[Finished],
    now_ms: int,
    *,
    keep: int = DEFAULT_KEEP,
    window_ms: int = DEFAULT_WINDOW_MS,
) -> list[str]:
    """The ids to prune, oldest first: beyond the newest ``keep`` (by finish order) and
    finished at least ``window_ms`` before ``now_ms``."""
    if keep < 0 or window_ms < 0:
        raise ValueError("keep and window_ms must be >= 0")
    newest_first = sorted(finished, key=lambda f: f.finished_seq, reverse=True)
    cutoff = now_ms - window_ms
    old = [f for f in newest_first[keep:] if f.finished_at <= cutoff]
    return [f.exec_id for f in reversed(old)]
