"""Workspace sync for command backends: push the projected files in, pull the changes back.

Before a run (:func:`push`), the workspace's projected files (``state.files``; blob content from
the blob store) are written into a fresh temporary directory, the *mirror*, which the backend
uses as its ``workdir`` (``process`` runs in it, ``container`` bind-mounts it, ``wasm``
preopens it). ``pushed`` is the number of files written. A push that fails (a blob missing, a
full disk, over the limits) raises :class:`PushFailed` and the run is aborted.

After the output has drained (:func:`scan` then :func:`plan`), the mirror is compared with what
was pushed: new and changed files become ``fileWritten`` drafts, removed ones ``fileDeleted``,
each with ``causationId`` = the execution's ``execRequested`` id and ``baseRev`` = the revision
that was pushed (0 for a new file), so a concurrent edit by someone else is a conflict, never
silently overwritten. A change under a read-only mount is not written back: it is reported in
``skipped`` as ``{path, mountRoot, op, reason: "read-only"}``.

The mounts (:func:`mounts_for`) come from the backend instance's ``access`` (``read``: the
whole workspace is read-only, whatever the policy) and the request's filesystem policy.

The pure part (mounts, diff, plan) has no I/O; :func:`push`/:func:`scan`/:func:`read_changes`
do their file work on worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final, Literal

import msgspec

from hub.core.errors import AgoraError
from hub.core.events import (
    Event,
    FileDeleted,
    FileDeletedPayload,
    FileWritten,
    FileWrittenPayload,
    SkippedWrite,
)
from hub.core.execution.policy import Access, FilesystemPolicy
from hub.core.execution.settings import SyncLimits
from hub.core.projections.workspace import FileEntry
from hub.core.validation import validate_path
from hub.log.base import BlobStore

__all__ = [
    "Change",
    "Mirror",
    "PushFailed",
    "Scan",
    "SyncLimits",
    "WorkspaceMount",
    "diff",
    "drafts_for",
    "mount_of",
    "mounts_for",
    "plan",
    "push",
    "read_changes",
    "remove_mirror",
    "scan",
]

Op = Literal["write", "delete"]

_HASH_CHUNK: Final = 1024 * 1024


class PushFailed(AgoraError):
    """The workspace could not be pushed into the sandbox; the run is aborted."""

    code = "internal"


DEFAULT_SYNC: Final = SyncLimits()


# ---------------------------------------------------------------------------------------------
# Mounts (pure)


class WorkspaceMount(msgspec.Struct, frozen=True):
    """A workspace subtree the program sees: ``root`` (``"."`` = all) and whether changes under
    it are written back."""

    root: str
    writable: bool


def mounts_for(access: Access, fs: FilesystemPolicy) -> tuple[WorkspaceMount, ...]:
    """The mounts of a run under ``fs`` on an instance with ``access``. ``()`` = no workspace
    (filesystem ``none``): nothing is pushed or pulled."""
    rw = access == "read-write"
    if fs.mode == "none":
        return ()
    if fs.mode == "host":
        return (WorkspaceMount(".", rw),)
    if fs.mode == "workspaceReadOnly":
        return (WorkspaceMount(fs.root, False),)
    if fs.mode == "workspaceReadWrite":
        return (WorkspaceMount(fs.root, rw),)
    return tuple(WorkspaceMount(p, False) for p in fs.read_only) + tuple(
        WorkspaceMount(p, rw) for p in fs.read_write
    )


def _within(path: str, root: str) -> bool:
    return root == "." or path == root or path.startswith(root + "/")


def mount_of(mounts: Iterable[WorkspaceMount], path: str) -> WorkspaceMount | None:
    """The most specific mount holding ``path`` (a read-only one wins a tie), or ``None``."""
    best: WorkspaceMount | None = None
    for mount in mounts:
        if not _within(path, mount.root):
            continue
        depth = -1 if mount.root == "." else mount.root.count("/")
        if best is None:
            best = mount
            continue
        best_depth = -1 if best.root == "." else best.root.count("/")
        if depth > best_depth or (depth == best_depth and not mount.writable):
            best = mount
    return best


class Change(msgspec.Struct, frozen=True):
    path: str
    op: Op


def diff(before: Mapping[str, str], after: Mapping[str, str]) -> list[Change]:
    """The changes from ``before`` to ``after`` (path → sha256), sorted by path."""
    changes = [Change(p, "write") for p, sha in after.items() if before.get(p) != sha]
    changes += [Change(p, "delete") for p in before if p not in after]
    return sorted(changes, key=lambda c: c.path)


def plan(
    changes: Iterable[Change], mounts: tuple[WorkspaceMount, ...], *, max_changes: int
) -> tuple[list[Change], list[SkippedWrite]]:
    """Split ``changes`` into those to write back and those skipped: under a read-only mount
    (``read-only``), or beyond ``max_changes`` (``tooMany``). Changes outside every mount
    (which the program could not have made) are dropped."""
    keep: list[Change] = []
    skipped: list[SkippedWrite] = []
    for change in changes:
        mount = mount_of(mounts, change.path)
        if mount is None:
            continue
        if not mount.writable:
            skipped.append(SkippedWrite(path=change.path, mount_root=mount.root, op=change.op))
        elif len(keep) >= max_changes:
            skipped.append(
                SkippedWrite(
                    path=change.path, mount_root=mount.root, op=change.op, reason="tooMany"
                )
            )
        else:
            keep.append(change)
    return keep, skipped


def drafts_for(
    changes: Iterable[Change],
    contents: Mapping[str, bytes],
    revs: Mapping[str, int],
    causation_id: str,
) -> list[Event]:
    """``fileWritten``/``fileDeleted`` drafts for ``changes`` (content from ``contents``), each
    caused by ``causation_id`` and guarded by ``baseRev`` = the pushed revision (0: new)."""
    drafts: list[Event] = []
    for change in changes:
        base_rev = revs.get(change.path, 0)
        if change.op == "delete":
            drafts.append(
                FileDeleted(
                    causation_id=causation_id,
                    payload=FileDeletedPayload(path=change.path, base_rev=base_rev),
                )
            )
            continue
        data = contents[change.path]
        try:
            payload = FileWrittenPayload(path=change.path, text=data.decode("utf-8"))
        except UnicodeDecodeError:
            payload = FileWrittenPayload(
                path=change.path, base64=base64.b64encode(data).decode("ascii")
            )
        drafts.append(
            FileWritten(
                causation_id=causation_id,
                payload=msgspec.structs.replace(payload, base_rev=base_rev),
            )
        )
    return drafts


# ---------------------------------------------------------------------------------------------
# Push and pull (file work on threads)


class Mirror(msgspec.Struct):
    """The directory a run works in, and what was pushed into it: path → (sha256, size,
    mtime_ns) as written, and path → the workspace revision pushed."""

    root: Path
    pushed: dict[str, tuple[str, int, int]] = {}
    revs: dict[str, int] = {}

    def sha256s(self) -> dict[str, str]:
        return {path: entry[0] for path, entry in self.pushed.items()}


def _decoded(entry: FileEntry) -> bytes | None:
    if entry.text is not None:
        return entry.text.encode("utf-8", "surrogatepass")
    if entry.base64 is not None:
        return base64.b64decode(entry.base64)
    return None


async def push(
    files: Mapping[str, FileEntry], blobs: BlobStore, limits: SyncLimits = DEFAULT_SYNC
) -> Mirror:
    """Write ``files`` into a fresh directory. Raises :class:`PushFailed` (the directory is
    removed again)."""
    if len(files) > limits.max_push_files:
        raise PushFailed(
            f"the workspace has {len(files)} files; at most {limits.max_push_files} are pushed",
            limit=limits.max_push_files,
        )
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="agora-ws-"))
    mirror = Mirror(root=root)
    if not files:
        return mirror
    try:
        total = 0
        batch: list[tuple[str, bytes]] = []
        batch_bytes = 0
        for path, entry in sorted(files.items()):
            data = _decoded(entry)
            if data is None:
                if entry.blob is None:
                    raise PushFailed(f"file {path!r} has no content in the log", path=path)
                # The size first: a blob over what is left is never read into memory.
                if total + await blobs.size(entry.blob) > limits.max_push_bytes:
                    raise PushFailed(
                        f"the workspace holds more than {limits.max_push_bytes} bytes to push",
                        limit=limits.max_push_bytes,
                    )
                data = await blobs.get(entry.blob)
            total += len(data)
            if total > limits.max_push_bytes:
                raise PushFailed(
                    f"the workspace holds more than {limits.max_push_bytes} bytes to push",
                    limit=limits.max_push_bytes,
                )
            mirror.revs[path] = entry.rev
            batch.append((path, data))
            batch_bytes += len(data)
            if batch_bytes >= 8 * 1024 * 1024:
                mirror.pushed.update(await asyncio.to_thread(_write_files, root, batch))
                batch, batch_bytes = [], 0
        if batch:
            mirror.pushed.update(await asyncio.to_thread(_write_files, root, batch))
    except BaseException as e:
        await asyncio.shield(remove_mirror(mirror))
        if isinstance(e, PushFailed | asyncio.CancelledError):
            raise
        if isinstance(e, AgoraError | OSError):
            raise PushFailed(f"pushing the workspace failed: {e}") from e
        raise
    return mirror


def _write_files(root: Path, batch: list[tuple[str, bytes]]) -> dict[str, tuple[str, int, int]]:
    out: dict[str, tuple[str, int, int]] = {}
    for path, data in batch:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        st = target.stat()
        out[path] = (hashlib.sha256(data).hexdigest(), st.st_size, st.st_mtime_ns)
    return out


class Scan(msgspec.Struct):
    """What the mirror holds after the run: path → sha256 of every regular file, and the
    entries that cannot be pulled (not a regular file, a name that is not a valid path, too
    large)."""

    files: dict[str, str]
    problems: list[SkippedWrite]


async def scan(mirror: Mirror, limits: SyncLimits = DEFAULT_SYNC) -> Scan:
    """Walk the mirror (on a thread). Files whose size and mtime are as pushed are not read
    again."""
    return await asyncio.to_thread(_scan, mirror, limits)


def _scan(mirror: Mirror, limits: SyncLimits) -> Scan:
    files: dict[str, str] = {}
    problems: list[SkippedWrite] = []
    root = mirror.root
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(directory, root)
        links = [d for d in dirnames if os.path.islink(os.path.join(directory, d))]
        for name in (*filenames, *links):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                rel.encode("utf-8")
                validate_path(rel)
            except (UnicodeEncodeError, AgoraError):
                problems.append(
                    SkippedWrite(
                        path=rel.encode("utf-8", "replace").decode(),
                        mount_root=".",
                        op="write",
                        reason="invalidPath",
                    )
                )
                continue
            full = os.path.join(directory, name)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                if rel not in mirror.pushed:
                    problems.append(
                        SkippedWrite(path=rel, mount_root=".", op="write", reason="notAFile")
                    )
                continue
            pushed = mirror.pushed.get(rel)
            if pushed is not None and pushed[1] == st.st_size and pushed[2] == st.st_mtime_ns:
                files[rel] = pushed[0]
                continue
            if st.st_size > limits.max_file_bytes:
                problems.append(
                    SkippedWrite(path=rel, mount_root=".", op="write", reason="tooLarge")
                )
                if pushed is not None:
                    files[rel] = pushed[0]  # not pulled, but not deleted either
                continue
            files[rel] = _hash_file(full)
    return Scan(files=files, problems=problems)


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


async def read_changes(mirror: Mirror, changes: Iterable[Change]) -> dict[str, bytes]:
    """The content of the written files among ``changes`` (on a thread)."""
    paths = [c.path for c in changes if c.op == "write"]
    if not paths:
        return {}
    return await asyncio.to_thread(_read_files, mirror.root, paths)


def _read_files(root: Path, paths: list[str]) -> dict[str, bytes]:
    return {path: (root / path).read_bytes() for path in paths}


async def remove_mirror(mirror: Mirror) -> None:
    """Remove the directory (on a thread); a missing one is fine."""
    await asyncio.to_thread(shutil.rmtree, mirror.root, True)
