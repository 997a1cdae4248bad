"""backends/hostcalls.py: the one rule every host-function sandbox checks a call against."""

from __future__ import annotations

import pytest

from backends.hostcalls import check_host_path
from hub.core.execution.policy import FilesystemPolicy

RW = FilesystemPolicy.workspace_read_write()
RO = FilesystemPolicy.workspace_read_only()


def check(op: str, path: object, fs: FilesystemPolicy = RW, access: str = "read-write") -> str:
    return check_host_path(
        op,  # type: ignore[arg-type]
        path,
        fs,
        instance="i",
        instance_access=access,  # type: ignore[arg-type]
        has_workspace=True,
        function="f",
    )


def test_paths_are_normalised_and_kept_inside() -> None:
    assert check("read", "./a//b.txt") == "a/b.txt"
    for bad in ("/etc/passwd", "../x", "a/../../x"):
        with pytest.raises(ValueError):
            check("read", bad)
    with pytest.raises(TypeError):
        check("read", 42)


def test_writes_need_a_read_write_instance_and_policy() -> None:
    assert check("write", "a.txt") == "a.txt"
    with pytest.raises(PermissionError, match="read-only access"):
        check("write", "a.txt", access="read")
    with pytest.raises(PermissionError, match="not writable"):
        check("delete", "a.txt", RO)
    assert check("read", "a.txt", RO) == "a.txt"


def test_no_workspace_refuses_everything() -> None:
    with pytest.raises(PermissionError, match="no workspace"):
        check("read", "a.txt", FilesystemPolicy.none())
    with pytest.raises(PermissionError, match="no workspace"):
        check_host_path(
            "list",
            ".",
            RW,
            instance="i",
            instance_access="read-write",
            has_workspace=False,
            function="f",
        )
