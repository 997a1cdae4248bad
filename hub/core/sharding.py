"""Which worker owns a workspace: ``agora serve --workers N`` (docs/architecture.md, "Workers").

Every worker computes the same answer from the name alone, with no table to share or keep: a
stable hash of the workspace name modulo the number of workers. SHA-256 rather than Python's
``hash`` (salted per process: two workers would disagree). Changing N moves workspaces between
workers; that is safe because the owner holds nothing durable of its own (the log is shared),
only its subscribers, which a restart reconnects anyway.
"""

from __future__ import annotations

import hashlib

__all__ = ["owner_of"]


def owner_of(workspace: str, workers: int) -> int:
    """The index (``0 .. workers-1``) of the worker that owns ``workspace``. Raises
    ``ValueError`` when ``workers < 1``."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if workers == 1:
        return 0
    digest = hashlib.sha256(workspace.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % workers
