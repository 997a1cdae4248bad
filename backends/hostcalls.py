"""The workspace host functions of the in-process sandboxes, checked the same way everywhere.

``python`` (Monty) and ``javascript`` (Deno) give their programs the workspace as four calls —
read, write, list, delete — served through the :class:`~backends.access.WorkspaceAccess` the
runtime passes to ``execute``, so each write becomes a ``fileWritten`` event caused by the
execution. :func:`check_host_path` is the rule both apply before the access object is ever
called: the instance's authority (a ``read`` instance refuses writes), the presence of a
workspace, the path's syntax (:func:`~hub.core.execution.policy.normalise_workspace_path`) and
the request's filesystem policy (``none``; ``workspaceReadOnly``/``workspaceReadWrite`` under
their root; ``paths`` per path). :func:`serve_host_call` then performs the call, bounded by a
timeout and a size cap.
"""

from __future__ import annotations

import asyncio
from typing import Final, Literal

from backends.access import Access, WorkspaceAccess
from hub.core.execution.errors import InvalidRequest
from hub.core.execution.policy import FilesystemPolicy, normalise_workspace_path
from hub.core.execution.request import ExecutionRequest

__all__ = [
    "MAX_WRITE_BYTES",
    "HostOp",
    "check_host_path",
    "has_readable_below",
    "readable",
    "refuse_process_inputs",
    "serve_host_call",
    "writable",
]

MAX_WRITE_BYTES: Final = 16 * 1024 * 1024
HostOp = Literal["read", "write", "list", "delete"]
_WRITING: Final = frozenset({"write", "delete"})


def _roots(fs: FilesystemPolicy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read-only roots, read-write roots) of a workspace filesystem policy."""
    if fs.mode == "workspaceReadOnly":
        return (fs.root,), ()
    if fs.mode == "workspaceReadWrite":
        return (), (fs.root,)
    if fs.mode == "paths":
        return fs.read_only, fs.read_write
    return (), ()


def _within(path: str, root: str) -> bool:
    return root == "." or path == root or path.startswith(root + "/")


def readable(fs: FilesystemPolicy, path: str) -> bool:
    ro, rw = _roots(fs)
    return any(_within(path, r) for r in ro + rw)


def writable(fs: FilesystemPolicy, path: str) -> bool:
    return path != "." and any(_within(path, r) for r in _roots(fs)[1])


def has_readable_below(fs: FilesystemPolicy, path: str) -> bool:
    ro, rw = _roots(fs)
    return any(_within(r, path) for r in ro + rw)


def check_host_path(
    op: HostOp,
    path: object,
    fs: FilesystemPolicy,
    *,
    instance: str,
    instance_access: Access,
    has_workspace: bool,
    function: str,
) -> str:
    """The normalised workspace path of a host call ``op`` on ``path``, or the exception the
    sandboxed code should see: :class:`PermissionError` (read-only instance, no workspace,
    outside the policy), :class:`ValueError` (a bad path), :class:`TypeError` (not a string).
    ``function`` is the name the program called (for the messages)."""
    if not isinstance(path, str):
        raise TypeError(f"{function}: path must be a string")
    if op in _WRITING and instance_access != "read-write":
        raise PermissionError(
            f"{function}: backend instance {instance!r} has read-only access to the workspace"
        )
    if not has_workspace or fs.mode == "none":
        raise PermissionError(f"{function}: no workspace is available to this execution")
    try:
        normalised = normalise_workspace_path(path, "path")
    except InvalidRequest as e:
        raise ValueError(f"{function}: {e.message}") from e
    if op == "list":
        if not readable(fs, normalised) and not has_readable_below(fs, normalised):
            raise PermissionError(f"{function}: {normalised!r} is outside the workspace policy")
    elif not (writable(fs, normalised) if op in _WRITING else readable(fs, normalised)):
        verb = "writable" if op in _WRITING else "readable"
        raise PermissionError(
            f"{function}: {normalised!r} is not {verb} under the filesystem policy"
        )
    return normalised


async def serve_host_call(
    op: HostOp,
    path: str,
    access: WorkspaceAccess,
    fs: FilesystemPolicy,
    *,
    data: bytes = b"",
    timeout_s: float,
    function: str,
) -> str | int | list[str] | None:
    """Perform a checked host call (:func:`check_host_path` first): the file's text (UTF-8,
    invalid bytes as U+FFFD), the bytes written, the readable paths listed, or ``None``.
    Raises what the access object raises, :class:`TimeoutError` after ``timeout_s``,
    :class:`ValueError` for content over :data:`MAX_WRITE_BYTES`."""
    if op == "write" and len(data) > MAX_WRITE_BYTES:
        raise ValueError(f"{function}: content is larger than {MAX_WRITE_BYTES} bytes")
    try:
        async with asyncio.timeout(timeout_s):
            if op == "read":
                return (await access.read(path)).decode("utf-8", "replace")
            if op == "write":
                await access.write(path, data)
                return len(data)
            if op == "list":
                return [p for p in await access.list(path) if readable(fs, p)]
            await access.delete(path)
            return None
    except TimeoutError as e:
        raise TimeoutError(f"{function}: the workspace did not answer in time") from e


def refuse_process_inputs(request: ExecutionRequest, sandbox: str) -> None:
    """An in-process sandbox's program has no stdin, argv or environment: refuse them (naming
    the field) rather than drop them; data goes in as ``input``."""
    for field_name, present in (
        ("stdin", request.stdin is not None),
        ("argv", bool(request.argv)),
        ("env", bool(request.env)),
    ):
        if present:
            raise InvalidRequest(
                f"the {sandbox} sandbox takes no {field_name}: pass data as input",
                field=field_name,
            )
