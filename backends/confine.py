"""Confinement of a host program under bubblewrap: the ``bwrap`` argument list, built purely.

:func:`bwrap_argv` turns a :class:`HostView` (what of the host any sandbox may see, found once
by :func:`host_view`) and a :class:`Sandbox` (what one run may see: its workspace mounts, its
working directory, whether it has a network) into the exact ``bwrap`` command line, so a test
can assert what a policy exposes. The program gets:

* new user, PID, IPC, UTS and cgroup namespaces, a new mount namespace whose root is an empty
  tmpfs remounted read-only, and a new (empty) network namespace unless the policy enables the
  network;
* uid/gid 65534 (``nobody``) inside the user namespace, no capabilities;
* read-only: the system directories (``/usr``, ``/bin``, ``/sbin``, ``/lib*`` — merged-usr
  symlinks recreated as symlinks), an ``/etc`` holding only copies of the few files programs
  need (dynamic loader, alternatives, locale, users; the resolver files and TLS roots only with
  the network on), and any ``extra`` path the backend needs (the interpreter's prefix, the
  build cache);
* its own ``/proc`` (its PID namespace only: the hub is invisible), a minimal ``/dev``, a
  private ``/tmp``;
* ``/workspace``: the workspace (or a subtree, or listed paths) bound read-only or read-write,
  or a private tmpfs when the policy gives it no workspace;
* nothing else: no data directory, no ``/root``, no ``/home``, no ``/etc/shadow``, no
  ``/etc/ssl/private``;
* ``--die-with-parent`` (a dead hub kills the sandbox) and ``--new-session`` (no TIOCSTI on the
  hub's terminal). Killing ``bwrap`` tears the PID namespace down, so ``setsid``/double-fork
  children die with the run.

:func:`workspace_mounts` maps a filesystem policy onto a workdir (resolving symlinks, making
missing directories: blocking, like the container backend's mounts). :func:`stage_etc`
copies the ``/etc`` files into a directory bound as the sandbox's ``/etc`` — one mount instead
of one per file (each mount costs a few hundred microseconds of every run's start), and a
sandbox never sees a file of the host's ``/etc`` that is not on the list; a hub makes that copy
once for all its confined backends (:mod:`backends.staging`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple

from hub.core.execution.errors import InvalidRequest
from hub.core.execution.policy import FilesystemPolicy

__all__ = [
    "NETWORK_ETC",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "SYSTEM_DIRS",
    "SYSTEM_ETC",
    "WORKSPACE",
    "HostView",
    "Mount",
    "Sandbox",
    "StagedEtc",
    "bwrap_argv",
    "host_view",
    "launcher_argv",
    "stage_etc",
    "stage_host_etc",
    "workspace_mounts",
]

WORKSPACE: Final = "/workspace"
SANDBOX_UID: Final = 65534
SANDBOX_GID: Final = 65534
HOSTNAME: Final = "agora"
SYSTEM_DIRS: Final[tuple[str, ...]] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
)
# What dynamically linked programs, Debian's alternatives symlinks and `id`/`ls -l` need.
SYSTEM_ETC: Final[tuple[str, ...]] = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
)
# Name resolution and TLS roots: only for a run with the network on (never /etc/ssl/private).
NETWORK_ETC: Final[tuple[str, ...]] = (
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates.conf",
)


@dataclass(frozen=True, slots=True)
class HostView:
    """What of the host every sandbox may see (read-only), as found on this host.

    ``dirs``: directories bound at the same path; ``links``: ``(path, target)`` symlinks
    recreated (merged-usr ``/bin -> usr/bin``); ``etc`` / ``network_etc``: the staged
    directories (:func:`stage_host_etc`) bound at ``/etc`` for a run without / with the network
    (``""``: no ``/etc``); ``extra``: further paths the backend needs (an interpreter's prefix,
    a build cache), bound at the same path."""

    dirs: tuple[str, ...]
    links: tuple[tuple[str, str], ...] = ()
    etc: str = ""
    network_etc: str = ""
    extra: tuple[str, ...] = ()

    def with_extra(self, paths: Iterable[str]) -> HostView:
        """This view plus ``paths`` (duplicates and paths already visible dropped)."""
        added = [p for p in paths if not self.shows(p) and p not in self.extra]
        return HostView(
            self.dirs, self.links, self.etc, self.network_etc, (*self.extra, *dict.fromkeys(added))
        )

    def shows(self, path: str) -> bool:
        """Whether ``path`` (absolute, normalised) is inside a bound directory already."""
        return any(path == d or path.startswith(d + "/") for d in (*self.dirs, *self.extra))


@dataclass(frozen=True, slots=True)
class Mount:
    """A host directory bound into the sandbox at ``target``."""

    source: Path
    target: str
    writable: bool


@dataclass(frozen=True, slots=True)
class Sandbox:
    """What one run may see: ``mounts`` under :data:`WORKSPACE` (none: a private tmpfs
    there), its working directory ``cwd`` (absolute, inside the sandbox) and the network."""

    mounts: tuple[Mount, ...]
    cwd: str = WORKSPACE
    network: bool = False


class StagedEtc(NamedTuple):
    """The two staged ``/etc`` directories (:func:`stage_host_etc`): for a run without and
    with the network."""

    etc: str
    network_etc: str


def host_view(extra: Iterable[str] = (), staged: StagedEtc | None = None) -> HostView:
    """The :class:`HostView` of this host: which system directories exist (and which are
    symlinks), plus ``extra``, with ``staged`` as its ``/etc`` (None: no ``/etc``). Blocking."""
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    etc, network_etc = staged if staged is not None else ("", "")
    view = HostView(tuple(dirs), tuple(links), etc, network_etc)
    return view.with_extra(os.path.realpath(p) for p in extra)


def stage_host_etc(root: Path) -> StagedEtc:
    """Make the sandboxes' ``/etc`` copies under ``root`` (``root/etc``: :data:`SYSTEM_ETC`;
    ``root/etc-net``: with :data:`NETWORK_ETC`; :func:`stage_etc`). Blocking."""
    etc = stage_etc(root / "etc", SYSTEM_ETC)
    network_etc = stage_etc(root / "etc-net", SYSTEM_ETC + NETWORK_ETC)
    return StagedEtc(str(etc), str(network_etc))


def stage_etc(target: Path, paths: Iterable[str]) -> Path:
    """Copy each of ``paths`` (``/etc/…`` files, directories or symlinks; missing ones
    skipped) to the same place under ``target``, symlinks as symlinks, world-readable.
    Returns ``target``. Blocking."""
    target.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(target, 0o755)
    for path in paths:
        if not os.path.lexists(path):
            continue
        dest = target / os.path.relpath(path, "/etc")
        dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if os.path.islink(path):
            os.symlink(os.readlink(path), dest)
        elif os.path.isdir(path):
            shutil.copytree(path, dest, symlinks=True)
        else:
            shutil.copyfile(path, dest)
            os.chmod(dest, 0o644)
    return target


def bwrap_argv(bwrap: str, view: HostView, box: Sandbox, command: Sequence[str]) -> list[str]:
    """The ``bwrap`` command line that runs ``command`` confined (see the module docstring).

    Pure: the same inputs give the same list, which is exactly what the program can see."""
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if not box.network:
        argv.append("--unshare-net")
    argv += [
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--hostname",
        HOSTNAME,
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]
    for path in view.dirs:
        argv += ["--ro-bind", path, path]
    for path, target in view.links:
        argv += ["--symlink", target, path]
    etc = view.network_etc if box.network else view.etc
    if etc:
        argv += ["--ro-bind", etc, "/etc"]
    for path in view.extra:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if not box.mounts or any(m.target != WORKSPACE for m in box.mounts):
        # No workspace, or only listed paths of it: a private, empty /workspace to hold them.
        argv += ["--tmpfs", WORKSPACE]
    # Parents before children (a read-write path may sit under a read-only one).
    for mount in sorted(box.mounts, key=lambda m: (m.target.count("/"), m.target)):
        argv += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
    if box.cwd != WORKSPACE and not any(_under(box.cwd, m.target) for m in box.mounts):
        argv += ["--dir", box.cwd]  # a working directory inside the private tmpfs
    argv += ["--remount-ro", "/", "--chdir", box.cwd, "--", *command]
    return argv


def launcher_argv(
    shell: str,
    procs_files: Sequence[str],
    *,
    open_files: int,
    file_blocks: int,
    memory_kib: int | None = None,
) -> list[str]:
    """The shell command that starts a confined run: it writes its own pid into each
    ``cgroup.procs`` of the run's groups, sets the rlimits (open files; file size in the
    shell's ``ulimit -f`` blocks; address space in KiB when no cgroup bounds memory), and execs
    the rest of its arguments (``bwrap …``). One shell, no extra ``exec`` per limit. Pure.

    The limits are set soft and hard, so the program cannot raise them again. A failure exits
    125 before anything runs."""
    steps = [
        'for f do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift',
        f"ulimit -n {int(open_files)} || exit 125",
        f"ulimit -f {int(file_blocks)} || exit 125",
    ]
    if memory_kib is not None:
        steps.append(f"ulimit -v {int(memory_kib)} || exit 125")
    steps.append('exec "$@"')
    return [shell, "-c", "; ".join(steps), "sh", *procs_files, "--"]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _inside(root: Path, rel: str, field: str) -> Path:
    """``root/rel`` resolved, refusing a symlink that leads out of ``root``."""
    path = (root / rel).resolve() if rel != "." else root
    if path != root and root not in path.parents:
        raise InvalidRequest(
            f"{field} {rel!r} leads out of the workspace (through a symlink)", field=field
        )
    return path


def workspace_mounts(
    workdir: Path | None, fs: FilesystemPolicy, cwd: str, *, writable: bool
) -> tuple[tuple[Mount, ...], str]:
    """The :class:`Mount` s that give ``fs`` of ``workdir`` at :data:`WORKSPACE`, and the
    sandbox working directory for the workspace path ``cwd``.

    ``writable`` False (a ``read`` instance) binds everything read-only whatever the policy.
    No workdir or mode ``none``: no mounts (a private tmpfs). Missing directories are made.
    Raises :class:`InvalidRequest` for a path that leads out of the workspace. Blocking."""
    inner_cwd = WORKSPACE if cwd == "." else f"{WORKSPACE}/{cwd}"
    if workdir is None or not fs.mounts_workspace:
        return (), inner_cwd
    root = workdir.resolve()
    if not root.is_dir():
        raise InvalidRequest(f"the workdir {str(workdir)!r} is not a directory", field="workdir")
    if fs.mode == "paths":
        specs = [(p, False) for p in fs.read_only] + [(p, writable) for p in fs.read_write]
    else:
        specs = [(fs.root, writable and fs.mode == "workspaceReadWrite")]
    mounts: list[Mount] = []
    for rel, rw in specs:
        source = _inside(root, rel, "filesystem")
        source.mkdir(parents=True, exist_ok=True)
        if fs.mode == "paths":
            target = WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}"
        else:
            target = WORKSPACE
        mounts.append(Mount(source, target, rw))
    if fs.mode != "paths":
        base = "." if fs.root == "." else fs.root
        host_cwd = _inside(root, cwd if base == "." else f"{base}/{cwd}", "cwd")
        host_cwd.mkdir(parents=True, exist_ok=True)
    return tuple(mounts), inner_cwd
