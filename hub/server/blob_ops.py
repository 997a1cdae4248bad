"""The blob ops of the wire (``putBlob``, ``blobChunk``, ``commitBlob``, ``getBlob``;
docs/protocol.md, "Blobs"), over the store's :class:`hub.log.base.BlobStore`.

The session decoded the frame and checked the rights (``write`` to upload, ``read`` to
download). This enforces the sizes (``[limits] max_blob_bytes`` per blob, the workspace's
quota ``max_workspace_bytes``, :data:`~hub.core.wire.frames.MAX_BLOB_CHUNK` per frame) and who
may read: a blob is downloadable through a workspace only while that workspace references
it (a file's content or an artifact), so knowing a hash never opens another workspace's
content. Every op handles one chunk at most: the hub never holds a whole blob.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from hub.config import LimitsConfig
from hub.core.errors import BadRequest, Busy, NotFound, TooLarge
from hub.core.wire.frames import (
    MAX_BLOB_CHUNK,
    BlobChunk,
    BlobData,
    BlobStatus,
    CommitBlob,
    GetBlob,
    PutBlob,
)
from hub.core.wire.session import BlobRequest
from hub.workspaces import Workspaces

__all__ = ["MAX_OPEN_UPLOADS", "OPEN_UPLOAD_S", "BlobOps"]

MAX_OPEN_UPLOADS: Final = 16
"""Uploads one agent may have begun and not committed (then ``busy``): partial uploads take
disk before they count against a quota, so their number is bounded."""

OPEN_UPLOAD_S: Final = 3600.0
"""After this long an upload no longer counts as open (``agora blobs gc`` removes it)."""


class BlobOps:
    """Answers the blob requests of every connection of one hub."""

    def __init__(
        self,
        workspaces: Workspaces,
        limits: LimitsConfig,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workspaces = workspaces
        self.limits = limits
        self._monotonic = monotonic
        # agent -> (sha256, size) of each upload it began -> when (monotonic seconds).
        self._open: dict[str, dict[tuple[str, int], float]] = {}

    def _begin(self, agent: str, key: tuple[str, int]) -> None:
        now = self._monotonic()
        uploads = self._open.setdefault(agent, {})
        for old in [k for k, t in uploads.items() if now - t > OPEN_UPLOAD_S]:
            del uploads[old]
        if key not in uploads and len(uploads) >= MAX_OPEN_UPLOADS:
            raise Busy(
                f"agent {agent!r} has {MAX_OPEN_UPLOADS} uploads begun and not committed; "
                "commit or abandon one",
                limit=MAX_OPEN_UPLOADS,
            )
        uploads[key] = now

    def _committed(self, agent: str, key: tuple[str, int]) -> None:
        uploads = self._open.get(agent)
        if uploads is not None:
            uploads.pop(key, None)
            if not uploads:
                del self._open[agent]

    async def answer(self, request: BlobRequest) -> BlobStatus | BlobData:
        blobs = self.workspaces.store.blobs
        workspace = request.workspace
        match request.frame:
            case PutBlob(sha256=sha, size=size):
                if size > self.limits.max_blob_bytes:
                    raise TooLarge(
                        f"a blob has at most {self.limits.max_blob_bytes} bytes (max_blob_bytes)",
                        field="$.size",
                        limit=self.limits.max_blob_bytes,
                        size=size,
                    )
                stored = await blobs.has(sha)
                if not stored:
                    await self.check_quota(workspace, size)
                    self._begin(request.agent, (sha, size))
                offset = size if stored else await blobs.upload_offset(sha, size)
                return BlobStatus(
                    workspace=workspace, sha256=sha, size=size, offset=offset, stored=stored
                )
            case BlobChunk(sha256=sha, size=size, offset=offset, data=data):
                if len(data) > MAX_BLOB_CHUNK:
                    raise TooLarge(
                        f"a chunk has at most {MAX_BLOB_CHUNK} bytes",
                        field="$.data",
                        limit=MAX_BLOB_CHUNK,
                        size=len(data),
                    )
                if (sha, size) not in self._open.get(request.agent, {}):
                    # Only through putBlob: its size, quota and open-upload checks hold.
                    raise NotFound(
                        f"no upload of blob {sha} ({size} bytes) begun by this agent: send "
                        "putBlob first",
                        field="$.sha256",
                    )
                held = await blobs.write_chunk(sha, size, offset, data)
                return BlobStatus(workspace=workspace, sha256=sha, size=size, offset=held)
            case CommitBlob(sha256=sha, size=size):
                try:
                    await blobs.commit(sha, size)
                except BadRequest as e:
                    if "offset" not in e.details:  # not incomplete: the upload was discarded
                        self._committed(request.agent, (sha, size))
                    raise
                self._committed(request.agent, (sha, size))
                return BlobStatus(
                    workspace=workspace, sha256=sha, size=size, offset=size, stored=True
                )
            case GetBlob(sha256=sha, offset=offset, length=length):
                if not await self.workspaces.references_blob(workspace, sha):
                    # Not "forbidden": whether the blob exists elsewhere is not told.
                    raise NotFound(
                        f"workspace {workspace!r} references no blob {sha}",
                        field="$.sha256",
                        sha256=sha,
                    )
                size = await blobs.size(sha)
                want = MAX_BLOB_CHUNK if length is None else min(length, MAX_BLOB_CHUNK)
                data = await blobs.read(sha, offset, want)
                return BlobData(
                    workspace=workspace, sha256=sha, size=size, offset=offset, data=data
                )
        raise AssertionError(f"unhandled blob frame {request.frame!r}")  # pragma: no cover

    async def check_quota(self, workspace: str, size: int) -> None:
        """Raise :class:`TooLarge` when ``size`` more bytes would take ``workspace`` over
        ``[limits] max_workspace_bytes``."""
        quota = self.limits.max_workspace_bytes
        used = await self.workspaces.stored_bytes(workspace)
        if used + size > quota:
            raise TooLarge(
                f"workspace {workspace!r} holds {used} bytes; {size} more would pass its quota "
                f"of {quota} (max_workspace_bytes)",
                field="$.size",
                limit=quota,
                used=used,
                size=size,
            )
