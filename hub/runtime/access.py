"""Workspace access for the ``python`` backend: its host functions go through the log.

The ``python`` (pydantic-monty) backend gives sandboxed code ``read_file``, ``write_file``,
``list_files`` and ``delete_file`` through a :class:`backends.access.WorkspaceAccess`.
:class:`LogAccess` implements it over :class:`hub.workspaces.Workspaces`: reads see the
workspace's projected files (blob content from the blob store), and every write or delete is
published at once as a ``fileWritten``/``fileDeleted`` event with ``causationId`` = the
execution's ``execRequested`` id, produced by the agent that asked for the execution. The
backend has checked the path against the policy and the instance's ``access`` before calling.
"""

from __future__ import annotations

import base64

from hub.core.errors import AgoraError, NotFound
from hub.core.events import FileDeleted, FileDeletedPayload, FileWritten, FileWrittenPayload
from hub.core.projections.workspace import FileEntry
from hub.workspaces import Workspaces

__all__ = ["LogAccess"]


class LogAccess:
    """:class:`backends.access.WorkspaceAccess` over one workspace's log, for one execution.

    ``writes`` counts the files written or deleted (the execution's ``pulled``).
    """

    def __init__(
        self, workspaces: Workspaces, workspace: str, *, producer: str, causation_id: str
    ) -> None:
        self._workspaces = workspaces
        self._workspace = workspace
        self._producer = producer
        self._causation_id = causation_id
        self.writes = 0

    async def _files(self) -> dict[str, FileEntry]:
        return await self._workspaces.files(self._workspace)

    async def read(self, path: str) -> bytes:
        entry = (await self._files()).get(path)
        if entry is None:
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        if entry.text is not None:
            return entry.text.encode("utf-8", "surrogatepass")
        if entry.base64 is not None:
            return base64.b64decode(entry.base64)
        if entry.blob is None:
            return b""
        try:
            return await self._workspaces.store.blobs.get(entry.blob)
        except AgoraError as e:
            raise OSError(f"cannot read {path!r}: {e.message}") from e

    async def write(self, path: str, data: bytes) -> None:
        try:
            payload = FileWrittenPayload(path=path, text=data.decode("utf-8"))
        except UnicodeDecodeError:
            payload = FileWrittenPayload(path=path, base64=base64.b64encode(data).decode())
        await self._publish(FileWritten(causation_id=self._causation_id, payload=payload), path)

    async def list(self, prefix: str) -> list[str]:
        files = await self._files()
        if prefix in (".", ""):
            return sorted(files)
        return sorted(p for p in files if p == prefix or p.startswith(prefix + "/"))

    async def delete(self, path: str) -> None:
        draft = FileDeleted(causation_id=self._causation_id, payload=FileDeletedPayload(path=path))
        await self._publish(draft, path)

    async def _publish(self, draft: FileWritten | FileDeleted, path: str) -> None:
        try:
            await self._workspaces.publish(
                self._workspace, [draft], producer=self._producer, trusted=True
            )
        except NotFound as e:
            raise FileNotFoundError(f"no file {path!r} in the workspace") from e
        except AgoraError as e:
            raise OSError(f"{path!r}: {e.message}") from e
        self.writes += 1
