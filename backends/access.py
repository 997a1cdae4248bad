"""Workspace access for in-process sandboxes: the :class:`WorkspaceAccess` protocol.

The ``python`` backend gives sandboxed code ``read_file``, ``write_file``, ``list_files`` and
``delete_file``. They do not touch the host filesystem: each call goes through a
:class:`WorkspaceAccess` the runtime passes to ``execute`` for that execution, so the files
are the workspace's *projected* files and every write becomes a ``fileWritten`` (every delete a
``fileDeleted``) event caused by the execution — the runtime's job, not the backend's.

Paths are workspace paths: relative POSIX, normalised
(:func:`hub.core.execution.policy.normalise_workspace_path`), never ``..``. The backend checks
every path
against the request's filesystem policy and its own access level before calling the access
object, so an implementation only has to do the I/O.

:class:`DirectoryAccess` implements the protocol over a local directory (the runtime's prepared
``workdir``, or a test's temporary directory). It is what the ``python`` backend uses when it is
given a ``workdir`` but no access object.

An in-process sandbox *instance* has an access level (:data:`Access`): ``read`` instances never
write the workspace, whatever a request's policy says; :func:`workspace_filesystem` is the
widest filesystem policy such an instance runs (its default policy's).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

from hub.core.execution.policy import Access, FilesystemPolicy, normalise_workspace_path

__all__ = ["Access", "DirectoryAccess", "WorkspaceAccess", "workspace_filesystem"]

"""An in-process sandbox instance's authority over the workspace."""


def workspace_filesystem(access: Access) -> FilesystemPolicy:
    """The workspace, read-write or read-only per ``access``. Raises :class:`ValueError` for
    an unknown access level."""
    if access not in ("read", "read-write"):
        raise ValueError(f"access must be 'read' or 'read-write', not {access!r}")
    if access == "read-write":
        return FilesystemPolicy.workspace_read_write()
    return FilesystemPolicy.workspace_read_only()


@runtime_checkable
class WorkspaceAccess(Protocol):
    """The workspace files one execution may use (see the module docstring).

    Every method raises :class:`FileNotFoundError` for a missing file (``read``, ``delete``),
    :class:`PermissionError` when the workspace refuses (e.g. a read-only mount), and
    :class:`OSError` for other failures; the message reaches the sandboxed code.
    """

    async def read(self, path: str) -> bytes:
        """The file's bytes."""
        ...

    async def write(self, path: str, data: bytes) -> None:
        """Create or replace the file (parent directories are implied)."""
        ...

    async def list(self, prefix: str) -> list[str]:
        """Every file path at or below ``prefix`` (``"."`` = the whole workspace), sorted."""
        ...

    async def delete(self, path: str) -> None:
        """Remove the file."""
        ...


class DirectoryAccess:
    """:class:`WorkspaceAccess` over a local directory (file work on a worker thread)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, path: str) -> Path:
        relative = normalise_workspace_path(path, "path")
        if relative == ".":
            raise IsADirectoryError(f"{path!r} is the workspace root, not a file")
        target = self.root / relative
        # A symbolic link must not lead out of the directory.
        if not target.resolve().is_relative_to(self.root.resolve()):
            raise PermissionError(f"{path!r} leads outside the workspace")
        return target

    async def read(self, path: str) -> bytes:
        target = self._path(path)
        return await asyncio.to_thread(target.read_bytes)

    async def write(self, path: str, data: bytes) -> None:
        target = self._path(path)

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        await asyncio.to_thread(write)

    async def list(self, prefix: str) -> list[str]:
        relative = normalise_workspace_path(prefix, "prefix")
        base = self.root if relative == "." else self.root / relative

        def walk() -> list[str]:
            if base.is_file():
                return [relative]
            found: list[str] = []
            for directory, _dirs, files in os.walk(base):
                for name in files:
                    found.append(Path(directory, name).relative_to(self.root).as_posix())
            return sorted(found)

        return await asyncio.to_thread(walk)

    async def delete(self, path: str) -> None:
        target = self._path(path)
        await asyncio.to_thread(target.unlink)
