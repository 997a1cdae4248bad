"""Projections: pure folds of the log into state, the lifecycle tables and the decide rules.

Everything here is pure except :mod:`hub.projections.loading`, which reads an
:class:`~hub.log.base.EventStore`. See docs/events.md for the rules and the diagrams.
"""

from hub.projections.decide import decide
from hub.projections.executions import (
    EXEC_LIFECYCLE,
    ExecJournal,
    ExecPhase,
    ExecRecord,
    ExecStatus,
    OutputChunk,
    exec_phase,
    exec_state_diagram,
    next_exec_phase,
    open_executions,
)
from hub.projections.lifecycle import IllegalTransition, Lifecycle
from hub.projections.loading import (
    load_journal,
    load_state,
    rebuild_state,
    save_snapshot_if_due,
)
from hub.projections.snapshots import (
    SNAPSHOT_NAME,
    SNAPSHOT_VERSION,
    decode_state,
    encode_state,
    from_snapshot,
    to_snapshot,
)
from hub.projections.work import (
    WORK_LIFECYCLE,
    WorkStatus,
    next_work_status,
    work_state_diagram,
)
from hub.projections.workspace import (
    ArtifactEntry,
    ExecSummary,
    FileEntry,
    Member,
    WorkItem,
    WorkspaceState,
    evolve,
    fold,
    rebuild,
)

__all__ = [
    "EXEC_LIFECYCLE",
    "SNAPSHOT_NAME",
    "SNAPSHOT_VERSION",
    "WORK_LIFECYCLE",
    "ArtifactEntry",
    "ExecJournal",
    "ExecPhase",
    "ExecRecord",
    "ExecStatus",
    "ExecSummary",
    "FileEntry",
    "IllegalTransition",
    "Lifecycle",
    "Member",
    "OutputChunk",
    "WorkItem",
    "WorkStatus",
    "WorkspaceState",
    "decide",
    "decode_state",
    "encode_state",
    "evolve",
    "exec_phase",
    "exec_state_diagram",
    "fold",
    "from_snapshot",
    "load_journal",
    "load_state",
    "next_exec_phase",
    "next_work_status",
    "open_executions",
    "rebuild",
    "rebuild_state",
    "save_snapshot_if_due",
    "to_snapshot",
    "work_state_diagram",
]
