"""Retention applied: dispose the finished executions :func:`hub.runtime.retention.prunable`
lets go (``execDisposed`` with ``reason: "retention"``, produced by ``hub``), after each run
and now and then for every loaded journal (age alone can make an execution prunable)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from hub.core.events import ExecDisposed, ExecDisposedPayload
from hub.core.execution.settings import RuntimeSettings
from hub.core.rules.recovery import HUB_PRODUCER
from hub.runtime.journal import Journals, WorkspaceJournal
from hub.runtime.retention import Finished, prunable
from hub.workspaces import Workspaces

__all__ = ["Pruner"]

log = logging.getLogger("agora.runtime")


class Pruner:
    """Retention for one runtime. ``disposing``: the (workspace, execId) keys whose
    ``execDisposed`` is being written (by retention or a ``dispose``), which are gone for
    every other operation meanwhile."""

    def __init__(
        self, workspaces: Workspaces, journals: Journals, settings: RuntimeSettings
    ) -> None:
        self.workspaces = workspaces
        self.journals = journals
        self.settings = settings
        self.disposing: set[tuple[str, str]] = set()

    async def prune(self, journal: WorkspaceJournal) -> int:
        """Dispose the finished executions of ``journal`` that retention lets go."""
        candidates = [
            Finished(rec.exec_id, rec.finished_seq, journal.finished_at.get(rec.exec_id, 0))
            for rec in journal.journal.executions.values()
            if rec.finished_seq is not None
            and not rec.disposed
            and (journal.workspace, rec.exec_id) not in self.disposing
        ]
        if len(candidates) <= self.settings.retention_keep:
            return 0
        ids = prunable(
            candidates,
            int(time.time() * 1000),
            keep=self.settings.retention_keep,
            window_ms=self.settings.retention_window_ms,
        )
        if not ids:
            return 0
        keys = {(journal.workspace, e) for e in ids}
        self.disposing |= keys
        try:
            await self.workspaces.publish(
                journal.workspace,
                [
                    ExecDisposed(payload=ExecDisposedPayload(exec_id=e, reason="retention"))
                    for e in ids
                ],
                producer=HUB_PRODUCER,
                trusted=True,
            )
        finally:
            self.disposing -= keys
        return len(ids)

    async def sweep(self, stop: asyncio.Event) -> None:
        """Apply retention to every loaded journal every ``retention_sweep_s`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.retention_sweep_s):
                    await stop.wait()
            if stop.is_set():
                return
            for journal in self.journals.loaded:
                try:
                    await self.prune(journal)
                except Exception:
                    log.exception("retention failed in %s", journal.workspace)
