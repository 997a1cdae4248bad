"""The bwrap argument list (backends/confine.py): exactly what a policy exposes. Pure, except
the workspace-mount tests, which use a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.base import FilesystemPolicy, InvalidRequest
from backends.confine import (
    NETWORK_ETC,
    SYSTEM_ETC,
    WORKSPACE,
    HostView,
    Mount,
    Sandbox,
    bwrap_argv,
    launcher_argv,
    stage_etc,
    workspace_mounts,
)

VIEW = HostView(
    dirs=("/usr",),
    links=(("/bin", "usr/bin"), ("/lib", "usr/lib")),
    etc="/stage/etc",
    network_etc="/stage/etc-net",
    extra=("/opt/python",),
)


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    """Every ``flag SRC DEST`` of ``argv`` as ``(SRC, DEST)``."""
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == flag]


def tmpfs(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]


def test_exact_argv_without_workspace() -> None:
    argv = bwrap_argv("/usr/bin/bwrap", VIEW, Sandbox(mounts=()), ["/bin/sh", "-c", "id"])
    assert argv == [
        "/usr/bin/bwrap",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--unshare-net",
        "--uid",
        "65534",
        "--gid",
        "65534",
        "--hostname",
        "agora",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--ro-bind",
        "/stage/etc",
        "/etc",
        "--ro-bind",
        "/opt/python",
        "/opt/python",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        WORKSPACE,
        "--remount-ro",
        "/",
        "--chdir",
        WORKSPACE,
        "--",
        "/bin/sh",
        "-c",
        "id",
    ]


def test_host_paths_never_exposed() -> None:
    box = Sandbox(mounts=(Mount(Path("/srv/ws"), WORKSPACE, True),), network=True)
    argv = bwrap_argv("bwrap", VIEW, box, ["true"])
    binds = pairs(argv, "--ro-bind") + pairs(argv, "--bind")
    assert "--ro-bind-try" not in argv and "--dev-bind" not in argv
    sources = {source for source, _ in binds}
    # Only the system view, the staged /etc (with the resolver: network on), the extra path
    # and the workspace.
    assert sources == {"/usr", "/stage/etc-net", "/opt/python", "/srv/ws"}
    for hidden in ("/", "/root", "/home", "/etc", "/etc/shadow", "/proc", "/sys", "/var"):
        assert hidden not in sources
    assert pairs(argv, "--bind") == [("/srv/ws", WORKSPACE)]


def test_network_namespace_follows_the_policy() -> None:
    off = bwrap_argv("bwrap", VIEW, Sandbox(mounts=()), ["true"])
    on = bwrap_argv("bwrap", VIEW, Sandbox(mounts=(), network=True), ["true"])
    assert "--unshare-net" in off and "--unshare-net" not in on
    assert ("/stage/etc", "/etc") in pairs(off, "--ro-bind")
    assert ("/stage/etc-net", "/etc") in pairs(on, "--ro-bind")


def test_always_confined_process_tree() -> None:
    argv = bwrap_argv("bwrap", VIEW, Sandbox(mounts=(), network=True), ["true"])
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in argv
    assert argv[argv.index("--proc") + 1] == "/proc"  # its own, of its own PID namespace
    assert argv[argv.index("--uid") + 1] == "65534"


def test_workspace_read_only_and_read_write(tmp_path: Path) -> None:
    ro, cwd = workspace_mounts(tmp_path, FilesystemPolicy.workspace_read_only(), ".", writable=True)
    assert ro == (Mount(tmp_path.resolve(), WORKSPACE, False),) and cwd == WORKSPACE
    rw, cwd = workspace_mounts(
        tmp_path, FilesystemPolicy.workspace_read_write(), "a/b", writable=True
    )
    assert rw == (Mount(tmp_path.resolve(), WORKSPACE, True),) and cwd == f"{WORKSPACE}/a/b"
    assert (tmp_path / "a" / "b").is_dir()
    argv = bwrap_argv("bwrap", VIEW, Sandbox(mounts=rw, cwd=cwd), ["true"])
    assert pairs(argv, "--bind") == [(str(tmp_path.resolve()), WORKSPACE)]
    assert tmpfs(argv) == ["/tmp"]  # the workspace is the bind itself, not a tmpfs
    assert argv[argv.index("--chdir") + 1] == f"{WORKSPACE}/a/b"


def test_read_instance_never_binds_read_write(tmp_path: Path) -> None:
    mounts, _ = workspace_mounts(
        tmp_path, FilesystemPolicy.workspace_read_write(), ".", writable=False
    )
    assert mounts == (Mount(tmp_path.resolve(), WORKSPACE, False),)
    argv = bwrap_argv("bwrap", VIEW, Sandbox(mounts=mounts), ["true"])
    assert pairs(argv, "--bind") == []


def test_subtree_root_is_the_whole_workspace_view(tmp_path: Path) -> None:
    fs = FilesystemPolicy.workspace_read_only(root="src")
    mounts, _ = workspace_mounts(tmp_path, fs, ".", writable=True)
    assert mounts == (Mount((tmp_path / "src").resolve(), WORKSPACE, False),)


def test_paths_mode_binds_each_path_over_a_private_tmpfs(tmp_path: Path) -> None:
    fs = FilesystemPolicy.paths(read_only=["src"], read_write=["src/out", "logs"])
    mounts, cwd = workspace_mounts(tmp_path, fs, ".", writable=True)
    root = tmp_path.resolve()
    assert set(mounts) == {
        Mount(root / "src", f"{WORKSPACE}/src", False),
        Mount(root / "src" / "out", f"{WORKSPACE}/src/out", True),
        Mount(root / "logs", f"{WORKSPACE}/logs", True),
    }
    argv = bwrap_argv("bwrap", VIEW, Sandbox(mounts=mounts, cwd=cwd), ["true"])
    assert tmpfs(argv) == ["/tmp", WORKSPACE]
    # Parents before children: the read-write path under the read-only one stays writable.
    order = [dest for _, dest in pairs(argv, "--ro-bind") + pairs(argv, "--bind")]
    targets = [a for a in argv if a.startswith(WORKSPACE + "/")]
    assert targets.index(f"{WORKSPACE}/src") < targets.index(f"{WORKSPACE}/src/out")
    assert set(order) >= {f"{WORKSPACE}/src", f"{WORKSPACE}/src/out", f"{WORKSPACE}/logs"}


def test_no_workspace_modes_bind_nothing(tmp_path: Path) -> None:
    assert workspace_mounts(tmp_path, FilesystemPolicy.none(), ".", writable=True) == (
        (),
        WORKSPACE,
    )
    assert workspace_mounts(None, FilesystemPolicy.workspace_read_write(), ".", writable=True) == (
        (),
        WORKSPACE,
    )
    mounts, cwd = workspace_mounts(tmp_path, FilesystemPolicy.none(), "sub", writable=True)
    argv = bwrap_argv("bwrap", VIEW, Sandbox(mounts=mounts, cwd=cwd), ["true"])
    assert argv[argv.index("--dir") + 1] == f"{WORKSPACE}/sub"  # made inside the tmpfs


def test_symlink_out_of_the_workspace_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    workdir = tmp_path / "ws"
    workdir.mkdir()
    (workdir / "escape").symlink_to(outside)
    with pytest.raises(InvalidRequest):
        workspace_mounts(
            workdir, FilesystemPolicy.workspace_read_only("escape"), ".", writable=True
        )
    with pytest.raises(InvalidRequest):
        workspace_mounts(workdir, FilesystemPolicy.paths(read_write=["escape"]), ".", writable=True)
    with pytest.raises(InvalidRequest):
        workspace_mounts(workdir, FilesystemPolicy.workspace_read_write(), "escape", writable=True)


def test_extra_paths_already_visible_are_not_bound_twice() -> None:
    view = HostView(dirs=("/usr",)).with_extra(["/usr/lib/python3", "/opt/py", "/opt/py"])
    assert view.extra == ("/opt/py",)


def test_launcher_joins_the_cgroups_then_sets_limits() -> None:
    argv = launcher_argv(
        "/bin/sh",
        ["/cg/memory/run/cgroup.procs", "/cg/pids/run/cgroup.procs"],
        open_files=1024,
        file_blocks=2048,
    )
    assert argv[:2] == ["/bin/sh", "-c"]
    script = argv[2]
    assert "ulimit -n 1024" in script and "ulimit -f 2048" in script and "ulimit -v" not in script
    assert script.index("echo $$") < script.index("ulimit")
    assert argv[3:] == ["sh", "/cg/memory/run/cgroup.procs", "/cg/pids/run/cgroup.procs", "--"]
    fallback = launcher_argv("/bin/sh", [], open_files=64, file_blocks=8, memory_kib=65536)
    assert "ulimit -v 65536" in fallback[2] and fallback[3:] == ["sh", "--"]


def test_staged_etc_holds_only_the_listed_files(tmp_path: Path) -> None:
    etc = stage_etc(tmp_path / "etc", SYSTEM_ETC)
    names = {p.relative_to(etc).parts[0] for p in etc.rglob("*")}
    assert names <= {Path(p).name for p in SYSTEM_ETC}
    assert "shadow" not in names and "ssl" not in names and "hosts" not in names
    assert (etc / "passwd").read_bytes() == Path("/etc/passwd").read_bytes()
    if Path("/etc/localtime").is_symlink():
        assert (etc / "localtime").readlink() == Path("/etc/localtime").readlink()
    net = stage_etc(tmp_path / "etc-net", SYSTEM_ETC + NETWORK_ETC)
    assert not (net / "ssl" / "private").exists()  # TLS roots only, never private keys
    assert (net / "resolv.conf").exists() == Path("/etc/resolv.conf").exists()
