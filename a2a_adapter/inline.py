"""Small artifacts go out with their bytes: file parts inlined under a limit.

The mapping (:mod:`a2a_adapter.mapping`) is pure, so an ``artifactPublished`` always crosses
as a file part naming the blob's download path (``/blobs/<workspace>/<sha256>`` on the HTTP
port, fetched with the peer's bearer token: :mod:`a2a_adapter.files`). Before a Task or an
artifact update leaves the hub, :func:`inline_files` replaces such a part's URL with the blob's
bytes when the blob is at most :data:`INLINE_MAX_BYTES` and the response's budget
(:data:`INLINE_BUDGET_BYTES`) has room, so a peer gets small outputs without a second request
and large ones without the hub holding them. Only blobs that the task's own workspace (its
``contextId``) references are inlined; a blob that is gone stays a URL (its download then
answers 404).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from a2a.types.a2a_pb2 import Artifact, ListTasksResponse, Task, TaskArtifactUpdateEvent

from a2a_adapter.mapping import blob_path
from hub.core.errors import AgoraError
from hub.core.validation import SHA256_RE
from hub.workspaces import Workspaces

__all__ = ["INLINE_BUDGET_BYTES", "INLINE_MAX_BYTES", "inline_files"]

INLINE_MAX_BYTES: Final = 64 * 1024
"""A blob at most this big goes inline (the hub's inline-content threshold for files)."""
INLINE_BUDGET_BYTES: Final = 1024 * 1024
"""Inlined bytes per response at most (a page of ListTasks included): the rest stay URLs."""

InlineReply = Task | TaskArtifactUpdateEvent | ListTasksResponse
"""An A2A reply whose small file parts are inlined (a task, an artifact update, a page of
ListTasks)."""


async def inline_files(
    message: InlineReply,
    workspaces: Workspaces,
    *,
    max_bytes: int = INLINE_MAX_BYTES,
    budget: int = INLINE_BUDGET_BYTES,
) -> None:
    """Inline, in place, the small blob file parts of ``message`` (see the module doc)."""
    left = budget
    for context_id, artifacts in _artifacts(message):
        prefix = blob_path(context_id, "")
        for artifact in artifacts:
            for part in artifact.parts:
                if part.WhichOneof("content") != "url" or not part.url.startswith(prefix):
                    continue
                sha = part.url[len(prefix) :]
                # The download route's own rule: only a blob the task's workspace references
                # (a URL part written into an event by hand names nothing else).
                if not SHA256_RE.fullmatch(sha):
                    continue
                try:
                    if not await workspaces.references_blob(context_id, sha):
                        continue
                    blobs = workspaces.store.blobs
                    size = await blobs.size(sha)
                    if size > max_bytes or size > left:
                        continue
                    data = await blobs.read(sha, 0, size)
                except (AgoraError, OSError, ValueError):
                    continue  # gone or unreadable: the URL stays (its download says why)
                if len(data) != size:
                    continue
                part.raw = data  # the content oneof: the URL is replaced
                left -= size


def _artifacts(message: InlineReply) -> Iterable[tuple[str, Iterable[Artifact]]]:
    if isinstance(message, TaskArtifactUpdateEvent):
        yield message.context_id, [message.artifact]
    elif isinstance(message, Task):
        yield message.context_id, message.artifacts
    else:
        for task in message.tasks:
            yield task.context_id, task.artifacts
