"""Which worker owns a workspace (``agora serve --workers N``, docs/architecture.md, "Workers"),
and which node (``[cluster] owners``, docs/operations.md, "Owners").

Every worker computes the same answer from the name alone, with no table to share or keep: a
stable hash of the workspace name modulo the number of workers. SHA-256 rather than Python's
``hash`` (salted per process: two workers would disagree). Changing N moves workspaces between
workers; that is safe because the owner holds nothing durable of its own (the log is shared),
only its subscribers, which a restart reconnects anyway.

Nodes come and go, so their owner is chosen by rendezvous hashing (highest random weight): the
node whose hash of (node id, workspace) is the largest. Every node computes it from the same
set of live node ids; a node that leaves moves only the workspaces it owned (each to the node
with the next weight), one that joins takes only those it now wins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["node_owner_of", "owner_of"]


def owner_of(workspace: str, workers: int) -> int:
    """The index (``0 .. workers-1``) of the worker that owns ``workspace``. Raises
    ``ValueError`` when ``workers < 1``."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    if workers == 1:
        return 0
    digest = hashlib.sha256(workspace.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % workers


def _weight(node: str, workspace: str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(node.encode("utf-8", "surrogatepass"))
    h.update(b"\x00")  # (node ids hold no NUL: "ab" + "c" and "a" + "bc" differ)
    h.update(workspace.encode("utf-8", "surrogatepass"))
    return h.digest()


def node_owner_of(workspace: str, nodes: Iterable[str]) -> str | None:
    """The node of ``nodes`` (ids) that owns ``workspace``: the highest weight, ties (never
    seen with a 128-bit hash) to the smaller id; None when ``nodes`` is empty."""
    best: tuple[bytes, str] | None = None
    for node in nodes:
        weight = _weight(node, workspace)
        if best is None or weight > best[0] or (weight == best[0] and node < best[1]):
            best = (weight, node)
    return None if best is None else best[1]
