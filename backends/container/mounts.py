"""The workspace as a container sees it: bind mounts of the host directory per the filesystem
policy, and the tree handed to the container's user. Blocking (run in the backend's pool)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from backends.container.spec import WORKSPACE
from hub.core.execution.errors import InvalidRequest
from hub.core.execution.policy import FilesystemPolicy

__all__ = ["chown_tree", "inside", "workspace_mounts"]


def inside(root: Path, rel: str, field: str) -> Path:
    """``root/rel`` resolved, refusing a symlink that leads out of ``root``."""
    path = (root / rel).resolve() if rel != "." else root
    if path != root and root not in path.parents:
        raise InvalidRequest(
            f"{field} {rel!r} leads out of the workspace (through a symlink)", field=field
        )
    return path


def workspace_mounts(
    workdir: Path, fs: FilesystemPolicy, cwd: str, uid: int, gid: int
) -> tuple[list[dict[str, Any]], str]:
    """Bind mounts for ``fs`` over ``workdir`` and the in-container working directory. Makes
    missing directories, and hands the tree to ``uid:gid`` when the hub is root (so the
    container's non-root user can read and write it). Blocking."""
    root = workdir.resolve()
    if not root.is_dir():
        raise InvalidRequest(f"the workdir {str(workdir)!r} is not a directory", field="workdir")
    if fs.mode == "paths":
        specs = [(p, True) for p in fs.read_only] + [(p, False) for p in fs.read_write]
    else:
        specs = [(fs.root, fs.mode == "workspaceReadOnly")]
    mounts: list[dict[str, Any]] = []
    for rel, read_only in specs:
        source = inside(root, rel, "filesystem")
        if not source.exists():
            source.mkdir(parents=True)
        if fs.mode == "paths":
            target = f"{WORKSPACE}/{rel}" if rel != "." else WORKSPACE
        else:
            target = WORKSPACE
        mounts.append(
            {
                "Type": "bind",
                "Source": str(source),
                "Target": target,
                "ReadOnly": read_only,
                "BindOptions": {"Propagation": "rprivate"},
            }
        )
    if fs.mode == "paths":
        working_dir = WORKSPACE if cwd == "." else f"{WORKSPACE}/{cwd}"
    else:
        base = "." if fs.root == "." else fs.root
        host_cwd = inside(root, cwd if base == "." else f"{base}/{cwd}", "cwd")
        host_cwd.mkdir(parents=True, exist_ok=True)
        working_dir = WORKSPACE if cwd == "." else f"{WORKSPACE}/{cwd}"
    if os.geteuid() == 0 and uid != 0:
        chown_tree(root, uid, gid)
    return mounts, working_dir


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give ``root`` and everything under it (not following symlinks) to ``uid:gid``."""
    for path in (root, *root.rglob("*")):
        with contextlib.suppress(FileNotFoundError):
            st = path.lstat()
            if st.st_uid != uid or st.st_gid != gid:
                os.lchown(path, uid, gid)
