"""hub/runtime/sync.py: mounts, diff and plan (pure), and push/scan/read on a real directory."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest

from hub.core.events import FileDeleted, FileWritten
from hub.core.execution.policy import FilesystemPolicy
from hub.core.projections.workspace import FileEntry
from hub.log.blobs import FileBlobStore
from hub.runtime.sync import (
    Change,
    PushFailed,
    SyncLimits,
    WorkspaceMount,
    diff,
    drafts_for,
    mount_of,
    mounts_for,
    plan,
    push,
    read_changes,
    remove_mirror,
    scan,
)


def entry(rev: int, text: str | None = None, blob: str | None = None) -> FileEntry:
    data = (text or "").encode()
    return FileEntry(rev, hashlib.sha256(data).hexdigest(), len(data), "a", 1, text=text, blob=blob)


def test_mounts_follow_access_and_policy() -> None:
    assert mounts_for("read-write", FilesystemPolicy.none()) == ()
    assert mounts_for("read-write", FilesystemPolicy.host()) == (WorkspaceMount(".", True),)
    assert mounts_for("read", FilesystemPolicy.host()) == (WorkspaceMount(".", False),)
    assert mounts_for("read-write", FilesystemPolicy.workspace_read_only("src")) == (
        WorkspaceMount("src", False),
    )
    assert mounts_for("read", FilesystemPolicy.workspace_read_write()) == (
        WorkspaceMount(".", False),
    )
    assert mounts_for("read-write", FilesystemPolicy.paths(["docs"], ["out"])) == (
        WorkspaceMount("docs", False),
        WorkspaceMount("out", True),
    )


def test_the_most_specific_mount_wins_and_read_only_breaks_ties() -> None:
    mounts = (
        WorkspaceMount(".", True),
        WorkspaceMount("a", False),
        WorkspaceMount("a/b", True),
        WorkspaceMount("a/b", False),
    )
    assert mount_of(mounts, "x.txt") == WorkspaceMount(".", True)
    assert mount_of(mounts, "a/x") == WorkspaceMount("a", False)
    assert mount_of(mounts, "a/b/c") == WorkspaceMount("a/b", False)
    assert mount_of((WorkspaceMount("a", True),), "ab/c") is None


def test_diff_and_plan() -> None:
    changes = diff(
        {"same": "1", "changed": "1", "gone": "1"}, {"same": "1", "changed": "2", "new": "3"}
    )
    assert changes == [Change("changed", "write"), Change("gone", "delete"), Change("new", "write")]
    keep, skipped = plan(
        changes, (WorkspaceMount(".", True), WorkspaceMount("gone", False)), max_changes=1
    )
    assert keep == [Change("changed", "write")]
    assert [(s.path, s.op, s.reason, s.mount_root) for s in skipped] == [
        ("gone", "delete", "read-only", "gone"),
        ("new", "write", "tooMany", "."),
    ]
    assert plan(changes, (WorkspaceMount("elsewhere", True),), max_changes=10) == ([], [])


def test_drafts_are_caused_and_guarded_by_base_rev() -> None:
    drafts = drafts_for(
        [Change("t.txt", "write"), Change("b.bin", "write"), Change("old", "delete")],
        {"t.txt": b"text", "b.bin": b"\xff"},
        {"t.txt": 3, "old": 7},
        "req-1",
    )
    t, b, old = drafts
    assert isinstance(t, FileWritten) and isinstance(b, FileWritten)
    assert isinstance(old, FileDeleted)
    assert (t.payload.text, t.payload.base_rev, t.causation_id) == ("text", 3, "req-1")
    assert (b.payload.base64, b.payload.base_rev) == ("/w==", 0)
    assert (old.payload.path, old.payload.base_rev) == ("old", 7)


async def test_push_scan_and_pull_a_real_directory(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "blobs")
    big = await blobs.put(b"B" * 100)
    files = {
        "a.txt": entry(1, "alpha"),
        "dir/b.txt": entry(4, "beta"),
        "big.bin": FileEntry(2, big, 100, "a", 1, blob=big),
    }
    mirror = await push(files, blobs)
    try:
        assert (mirror.root / "dir/b.txt").read_text() == "beta"
        assert (mirror.root / "big.bin").read_bytes() == b"B" * 100
        assert mirror.revs == {"a.txt": 1, "dir/b.txt": 4, "big.bin": 2}
        (mirror.root / "a.txt").write_text("changed")
        (mirror.root / "dir/b.txt").unlink()
        (mirror.root / "new").mkdir()
        (mirror.root / "new/c.txt").write_text("gamma")
        os.symlink("/etc/passwd", mirror.root / "link")
        (mirror.root / "huge").write_bytes(b"x" * 50)
        found = await scan(mirror, SyncLimits(max_file_bytes=40))
        changes = diff(mirror.sha256s(), found.files)
        assert changes == [
            Change("a.txt", "write"),
            Change("dir/b.txt", "delete"),
            Change("new/c.txt", "write"),
        ]
        assert sorted((p.path, p.reason) for p in found.problems) == [
            ("huge", "tooLarge"),
            ("link", "notAFile"),
        ]
        contents = await read_changes(mirror, changes)
        assert contents == {"a.txt": b"changed", "new/c.txt": b"gamma"}
    finally:
        await remove_mirror(mirror)
    assert not mirror.root.exists()


def _leftovers(root: Path) -> list[Path]:
    return list(root.iterdir())


async def test_a_failed_push_removes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    blobs = FileBlobStore(tmp_path / "blobs")
    missing = "0" * 64
    with pytest.raises(PushFailed, match="pushing the workspace failed"):
        await push({"x": FileEntry(1, missing, 1, "a", 1, blob=missing)}, blobs)
    with pytest.raises(PushFailed, match="at most 1"):
        await push({"a": entry(1, "a"), "b": entry(1, "b")}, blobs, SyncLimits(max_push_files=1))
    assert _leftovers(scratch) == []


async def test_a_blob_over_max_push_bytes_is_refused_before_it_is_read(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "blobs")
    sha = await blobs.put(b"y" * 5000)
    # Damaged on disk: reading it would fail its hash check, so only an unread blob can be
    # refused for its size.
    blobs.path_of(sha).write_bytes(b"z" * 5000)
    big = FileEntry(1, sha, 5000, "a", 1, blob=sha)
    with pytest.raises(PushFailed, match="more than 1000 bytes"):
        await push({"big": big}, blobs, SyncLimits(max_push_bytes=1000))
