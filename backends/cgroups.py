"""Per-run control groups for the confined ``process`` backend: memory, pids and cpu limits
that hold, and a kill that reaches everything a run started.

:meth:`CgroupHost.probe` finds what this host offers, never assuming: the unified hierarchy
(cgroup v2, one directory per group) or the per-controller v1 hierarchies (as on the CI
machines), read from ``/proc/self/mounts`` and ``/proc/self/cgroup``; a controller counts only
if a group can really be made under the hub's own group. Groups are named
``agora-hub-<hub pid>/run-<n>``: :meth:`CgroupHost.sweep` kills and removes those of hubs that
are no longer alive (a hub that was SIGKILLed), never another live hub's.

A run joins its group before ``bwrap`` starts (the launcher writes its own pid into each
``cgroup.procs`` and then execs), so every process of the run is counted from the first.

Blocking file operations on cgroupfs (each a few microseconds: no disk behind them).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

__all__ = ["CONTROLLERS", "CgroupHost", "Controller", "RunCgroup", "RunLimits"]

log = logging.getLogger(__name__)

Controller = Literal["memory", "pids", "cpu"]
CONTROLLERS: Final[tuple[Controller, ...]] = ("memory", "pids", "cpu")
CPU_PERIOD_US: Final = 100_000
HUB_PREFIX: Final = "agora-hub-"
REMOVE_TRIES: Final = 200  # x 10 ms: a killed group empties within milliseconds


@dataclass(frozen=True, slots=True)
class RunLimits:
    """The limits of one run's group (``None``: not limited)."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None


def _mounts() -> list[tuple[str, str, set[str]]]:
    """``(mount point, fstype, options)`` of every cgroup mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                found.append((parts[1], parts[2], set(parts[3].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) → this process's group path, from ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _base(mount: str, own: str | None) -> Path:
    """The hub's own group under ``mount`` (its mount root when the path is not visible
    there, as inside a container whose cgroup namespace hides the parents)."""
    if own:
        candidate = Path(mount) / own.lstrip("/")
        if candidate.is_dir():
            return candidate
    return Path(mount)


def _make(path: Path) -> bool:
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return False
    return True


def _make_run_dir(path: Path) -> None:
    """Make a run group, and the hub's parent group if it is gone (another backend of this
    hub removes it when it closes, possibly between the two ``mkdir``)."""
    for _ in range(3):
        path.parent.mkdir(exist_ok=True)
        try:
            path.mkdir()
        except FileNotFoundError:
            continue
        return
    path.mkdir()


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class CgroupHost:
    """Where this hub makes run groups, and which controllers they enforce."""

    def __init__(self, version: Literal["v1", "v2"], dirs: dict[Controller, Path]) -> None:
        self.version = version
        self._dirs = dirs  # controller → this hub's parent group (agora-hub-<pid>)
        self._counter = itertools.count(1)

    @property
    def controllers(self) -> frozenset[Controller]:
        return frozenset(self._dirs)

    def __repr__(self) -> str:
        return f"CgroupHost({self.version}, {sorted(self._dirs)})"

    @classmethod
    def probe(cls, hub_pid: int | None = None) -> CgroupHost | None:
        """What this host offers (``None``: no usable controller). Makes this hub's parent
        group(s) ``agora-hub-<pid>``."""
        pid = os.getpid() if hub_pid is None else hub_pid
        mounts = _mounts()
        own = _own_paths()
        v1 = [m for m in mounts if m[1] == "cgroup"]
        v2 = [m for m in mounts if m[1] == "cgroup2"]
        if v1:
            dirs: dict[Controller, Path] = {}
            for controller in CONTROLLERS:
                for point, _, options in v1:
                    if controller in options:
                        hub = _base(point, own.get(controller)) / f"{HUB_PREFIX}{pid}"
                        if _make(hub) and (hub / "cgroup.procs").exists():
                            dirs[controller] = hub
                        break
            if dirs:
                return cls("v1", dirs)
        for point, _, _ in v2:
            base = _base(point, own.get(""))
            hub = base / f"{HUB_PREFIX}{pid}"
            try:
                offered = set((base / "cgroup.controllers").read_text().split())
            except OSError:
                continue
            wanted = [c for c in CONTROLLERS if c in offered]
            if not wanted or not _make(hub):
                continue
            enabled: dict[Controller, Path] = {}
            for controller in wanted:
                # Delegation: the parent and the hub's group must pass the controller down.
                with contextlib.suppress(OSError):
                    _write(base / "cgroup.subtree_control", f"+{controller}")
                try:
                    _write(hub / "cgroup.subtree_control", f"+{controller}")
                except OSError:
                    continue
                enabled[controller] = hub
            if enabled:
                return cls("v2", enabled)
            with contextlib.suppress(OSError):
                hub.rmdir()
        return None

    def create(self, limits: RunLimits) -> RunCgroup:
        """A new run group with ``limits`` (only the controllers this host has). Raises
        ``OSError`` if the group cannot be made."""
        name = f"run-{next(self._counter)}-{os.urandom(4).hex()}"
        dirs = sorted({path / name for path in self._dirs.values()})
        group = RunCgroup(self.version, dirs)
        try:
            for path in dirs:
                _make_run_dir(path)
            self._limit(group, name, limits)
        except OSError:
            group.remove()
            raise
        return group

    def _limit(self, group: RunCgroup, name: str, limits: RunLimits) -> None:
        if limits.memory_bytes is not None and "memory" in self._dirs:
            memory = self._dirs["memory"] / name
            if self.version == "v1":
                _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
                # Swap counts too, where accounted: a hog must not spill into swap.
                with contextlib.suppress(OSError):
                    _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            else:
                _write(memory / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    _write(memory / "memory.swap.max", "0")
            group.memory = memory
        if limits.pids is not None and "pids" in self._dirs:
            _write(self._dirs["pids"] / name / "pids.max", str(limits.pids))
        if limits.cpus is not None and "cpu" in self._dirs:
            cpu = self._dirs["cpu"] / name
            quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
            if self.version == "v1":
                _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(quota))
            else:
                _write(cpu / "cpu.max", f"{quota} {CPU_PERIOD_US}")

    def sweep(self) -> int:
        """Kill and remove the run groups of hubs that are gone. Returns how many."""
        removed = 0
        parents = {path.parent for path in self._dirs.values()}
        for parent in parents:
            with contextlib.suppress(OSError):
                for hub in parent.iterdir():
                    if not hub.name.startswith(HUB_PREFIX) or _alive(hub.name[len(HUB_PREFIX) :]):
                        continue
                    for run in [p for p in hub.iterdir() if p.is_dir()]:
                        RunCgroup(self.version, [run]).remove()
                        removed += 1
                    with contextlib.suppress(OSError):
                        hub.rmdir()
        if removed:
            log.warning("removed %d run cgroups left by hubs that are gone", removed)
        return removed

    def close(self) -> None:
        """Remove this hub's parent groups (when no run group is left in them)."""
        for path in self._dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def _alive(pid_text: str) -> bool:
    if not pid_text.isdigit():
        return True  # not ours to judge
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class RunCgroup:
    """One run's group: a directory per v1 controller, or one v2 directory."""

    version: Literal["v1", "v2"]
    dirs: Sequence[Path]
    memory: Path | None = field(default=None)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the launcher writes its pid into."""
        return [str(path / "cgroup.procs") for path in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL every process in the group (``cgroup.kill`` where v2 has it)."""
        for path in self.dirs:
            with contextlib.suppress(OSError):
                if self.version == "v2" and (path / "cgroup.kill").exists():
                    _write(path / "cgroup.kill", "1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def memory_exceeded(self) -> bool:
        """Whether the kernel killed a process of the group for exceeding its memory."""
        if self.memory is None:
            return False
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.memory / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        if self.version == "v1":
            # Kernels without the oom_kill counter: a hit limit is the best sign left.
            with contextlib.suppress(OSError, ValueError):
                return int((self.memory / "memory.failcnt").read_text()) > 0
        return False

    def try_remove(self) -> bool:
        """Remove the group if it is empty. False if a directory is still busy."""
        done = True
        for path in self.dirs:
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                done = False
        return done

    def remove(self) -> None:
        """Kill what is left and remove the group, waiting (blocking, bounded) until the
        killed processes are gone."""
        for _ in range(REMOVE_TRIES):
            self.kill()
            if self.try_remove():
                return
            time.sleep(0.01)
        log.warning("cgroup %s is still busy; left in place", [str(p) for p in self.dirs])
