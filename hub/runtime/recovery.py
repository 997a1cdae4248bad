"""Restart recovery: close every execution the log shows unfinished, because the hub stopped
under it (docs/execution.md, "Restart recovery").

The rule — what to append for an interrupted execution — is the core's
(:func:`hub.core.rules.recovery.interrupted_drafts`), the same one a surviving cluster node
applies to a dead node's executions (:mod:`hub.cluster.interrupted`); this module finds the
open executions in the runtime's journals and appends the drafts on nobody's behalf
(producer ``hub``). Run at start, before serving, on a single node (on a shared store the
cluster does it).
"""

from __future__ import annotations

import logging
from collections.abc import Container

from hub.core.projections.executions import open_executions
from hub.core.rules.recovery import (
    HUB_PRODUCER,
    OpenExecution,
    interrupted_drafts,
    restart_interruption,
)
from hub.runtime.journal import Journals, WorkspaceJournal
from hub.runtime.recovery_index import RecoveryIndex
from hub.workspaces import Workspaces

__all__ = ["open_runs", "recover"]

log = logging.getLogger("agora.runtime")


def open_runs(journal: WorkspaceJournal) -> list[OpenExecution]:
    """The executions of ``journal`` with no terminal event (requested or running), as the
    recovery rule takes them."""
    runs: list[OpenExecution] = []
    for exec_id in open_executions(journal.journal, include_requested=True):
        rec = journal.record(exec_id)
        if rec is None:
            continue
        started = rec.status == "running" and rec.started_seq is not None
        runs.append(
            OpenExecution(
                workspace=journal.workspace,
                exec_id=exec_id,
                started=started,
                seq=rec.started_seq if rec.started_seq is not None and started else rec.request_seq,
                event_id=(journal.started_ids.get(exec_id) if started else None)
                or journal.request_ids.get(exec_id),
                next_n=journal.last_n.get(exec_id, 0) + 1,
            )
        )
    return runs


async def recover(
    workspaces: Workspaces,
    journals: Journals,
    *,
    closed_by: str,
    live: Container[tuple[str, str]] = (),
    index: RecoveryIndex | None = None,
) -> tuple[int, list[WorkspaceJournal]]:
    """Close every open execution (except the ``live`` ones, running here) as
    ``failed/interrupted``. Returns how many were closed and the journals visited (for
    retention).

    With a complete ``index`` only the workspaces it names are read; without one, every
    workspace (and the index is then built). A workspace whose recovery fails (its log cannot
    be read, the close cannot be written) is quarantined — logged, refused with
    ``unavailable`` while the hub serves the others — and tried again at the next start."""
    why = restart_interruption(closed_by)
    closed = 0
    visited: list[WorkspaceJournal] = []
    if index is not None and index.complete:
        names = sorted(index.workspaces())
    else:
        names = [head.workspace for head in await workspaces.store.heads()]
    still_open: set[tuple[str, str]] = set()
    quarantined: dict[str, str] = {}
    for name in names:
        try:
            journal = await journals.get(name)
            visited.append(journal)
            for run in open_runs(journal):
                if (run.workspace, run.exec_id) in live:
                    still_open.add((run.workspace, run.exec_id))
                    continue
                await workspaces.publish(
                    run.workspace,
                    interrupted_drafts(run, why),
                    producer=HUB_PRODUCER,
                    trusted=True,
                )
                closed += 1
                log.warning("execution %s in %s closed as interrupted", run.exec_id, name)
        except Exception as e:  # one damaged workspace must not keep the hub from starting
            # (A log that cannot be read back is quarantined where it is read, with why.)
            reason = workspaces.quarantined.get(name)
            if reason is None:
                reason = f"recovery failed: {type(e).__name__}: {e}"[:500]
                log.error("workspace %s quarantined: %s", name, reason)
            quarantined[name] = reason
            journals.forget(name)
    for name, reason in quarantined.items():
        workspaces.quarantine(name, reason)
    if index is not None:
        kept = {key for key in index.executions if key[0] in quarantined}
        index.executions = kept | still_open
        for name in names:
            index.quarantined.pop(name, None)
        index.quarantined.update(quarantined)
        await index.save()
    return closed, visited
