"""The staged ``/etc`` of one hub's sandboxes: copied once, shared by every confined instance.

A confined run sees an ``/etc`` holding copies of a few host files (:func:`backends.confine.
stage_host_etc`: two directories, without and with the network's files; about 1,100 entries,
mostly the symlinks of ``/etc/alternatives`` and ``/etc/ssl/certs``). Every confined backend
instance used to make its own copy as it started — four in a hub with the default backends
(process, javascript, and rust's build and run), made in background threads while the hub
already served. Each entry is a file-system metadata operation, slow on some disks: on the test
VM's ext4 a symlink costs about 1.1 ms, a copy 0.5-1.2 s, and a default hub spent about 2 s of
CPU on the four. The copies are the same, so the registry gives every instance of a hub one
:class:`EtcStaging`: the first instance to start makes the copy, the last to close removes it
(and the registry, as it closes, removes one that a start cancelled midway left, waiting for it
to be made first).
An instance built on its own (a test, a benchmark) gets a private one, as before.

The copy lives under the temporary directory as ``agora-sandbox-<hub pid>-…`` (mode 0700, as
``mkdtemp`` makes it); the first copy a process makes also removes those of hubs that are gone
(a SIGKILLed hub cannot remove its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Final

from backends.confine import StagedEtc, stage_host_etc

__all__ = ["STAGING_PREFIX", "EtcStaging"]

STAGING_PREFIX: Final = "agora-sandbox-"  # + "<hub pid>-…": the staged /etc of the sandboxes


class EtcStaging:
    """One staged ``/etc``, counted: :meth:`acquire` (the first makes it), :meth:`release`
    (the last removes it). Acquired on the event loop; released from any thread (a backend
    closes its confinement in a worker thread)."""

    def __init__(self) -> None:
        # The copy under way (in its thread), awaited by every acquire until it ends: one
        # copy, however many instances start at once, and whichever of them is cancelled.
        self._making: asyncio.Task[None] | None = None
        self._state = threading.Lock()  # the count and the directory, against release()
        self._root: Path | None = None
        self._staged: StagedEtc | None = None
        self._users = 0

    @property
    def users(self) -> int:
        """How many instances hold the copy (for tests)."""
        return self._users

    @property
    def root(self) -> Path | None:
        """The directory holding the copy, None when none is held."""
        return self._root

    async def acquire(self) -> StagedEtc:
        """The staged directories, made on first use. Raises ``OSError`` when they cannot be
        made (then nothing is left behind and nothing is held; the next acquire tries again).
        Cancelled while the copy is being made (a hub stopped as its backends start), the copy
        goes on in its thread and is recorded when it ends: the next acquire waits for that
        one rather than making another, and :meth:`aclose` removes it."""
        while True:
            with self._state:
                if self._staged is not None:
                    self._users += 1
                    return self._staged
            making = self._making
            if making is None or making.done():  # none yet, or removed since, or it failed
                making = self._making = asyncio.create_task(
                    asyncio.to_thread(self._make), name="agora-etc-staging"
                )
                # Its failure is raised to the acquires awaiting it; with none left (all
                # cancelled), retrieved here so that it is not reported as never retrieved.
                making.add_done_callback(_retrieve)
            await asyncio.shield(making)

    def _make(self) -> None:  # in a worker thread
        root, staged = _make()
        with self._state:
            self._root, self._staged = root, staged

    def release(self) -> None:
        """Give up one hold; the last removes the copy. Blocking (the removal)."""
        with self._state:
            if self._users == 0:
                return
            self._users -= 1
        self.close()

    async def aclose(self) -> None:
        """:meth:`close`, once a copy still being made (its acquire cancelled) has ended: the
        owner's close, once every instance has closed (the registry's)."""
        making = self._making
        if making is not None and not making.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(making)
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Remove the copy if nobody holds it (this also removes one whose acquire was
        cancelled, once its thread has recorded it: :meth:`aclose` waits for that). Blocking."""
        with self._state:
            if self._users:
                return
            root, self._root, self._staged = self._root, None, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _make() -> tuple[Path, StagedEtc]:
    _sweep_dead()
    root = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    try:
        return root, stage_host_etc(root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _sweep_dead() -> None:
    """Remove the staged ``/etc`` directories of hubs that are gone (SIGKILLed). Blocking."""
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in root.glob(f"{STAGING_PREFIX}*-*"):
            pid = path.name[len(STAGING_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
