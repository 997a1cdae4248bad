"""backends/staging.py: the sandboxes' staged ``/etc`` is made once per hub and shared by every
confined instance of its registry, which all run programs that see it; the last instance to
close removes it. (Each confined instance made its own copy: four in a hub with the default
backends, about 2 s of CPU at its start on the test VM's disk.) Real bubblewrap, real files."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from backends.base import CodeExecutor, ExecutionLanguage, Source
from backends.confine import StagedEtc
from backends.javascript import JavaScriptBackend, find_deno
from backends.process import ProcessBackend
from backends.rust import RustBackend
from backends.staging import STAGING_PREFIX, EtcStaging
from hub.config import BackendConfig
from hub.runtime.registry import BackendRegistry
from tests.backends.helpers import drain, host_rust_settings, new_request
from tests.support.require import require
from tests.support.waiting import wait_for

HOST_PASSWD = Path("/etc/passwd").read_bytes()


def _exists(path: Path) -> bool:
    return path.exists()


def _stagings() -> set[Path]:
    """The staged /etc directories this process holds."""
    return set(Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}{os.getpid()}-*"))


async def test_every_confined_instance_of_a_registry_shares_one_staged_etc() -> None:
    before = _stagings()
    registry = BackendRegistry.from_config(
        [
            BackendConfig(id="rw", kind="process"),
            BackendConfig(id="ro", kind="process", access="read"),
            BackendConfig(id="net", kind="process", limits={"network": "enabled"}),
        ]
    )
    made: set[Path] = set()
    try:
        await registry.start_all()
        for instance in registry:
            ok, why = instance.available()
            require("bwrap", ok, why)
        made = _stagings() - before
        assert len(made) == 1, made  # one copy for the three instances
        passwd = HOST_PASSWD
        for instance in registry:
            backend = instance.backend
            request = new_request(
                backend, language=ExecutionLanguage.COMMAND, payload=Source("cat /etc/passwd")
            )
            result, chunks = await drain(backend.execute(request, None))
            assert result.exit_code == 0, (instance.id, result)
            assert b"".join(c.data for c in chunks if c.stream == "stdout") == passwd
        [root] = made
        assert _exists(root / "etc" / "passwd") and _exists(root / "etc-net" / "passwd")
    finally:
        await registry.aclose()
    assert not any(_exists(p) for p in made)  # the last instance to close removed it
    assert _stagings() == before


async def test_the_first_acquire_makes_the_copy_and_the_last_release_removes_it() -> None:
    staging = EtcStaging()
    held = await asyncio.gather(*(staging.acquire() for _ in range(5)))  # at once
    assert len(set(held)) == 1 and staging.users == 5
    root = staging.root
    assert root is not None and Path(held[0].etc).parent == root
    assert isinstance(held[0], StagedEtc) and _exists(Path(held[0].network_etc, "passwd"))
    for _ in range(4):
        staging.release()
    assert _exists(root)
    staging.release()
    assert not _exists(root) and staging.root is None and staging.users == 0
    staging.release()  # one too many: nothing held, nothing happens
    again = await staging.acquire()  # made anew
    assert _exists(Path(again.etc)) and Path(again.etc).parent != root
    staging.release()


async def test_a_copy_whose_acquire_was_cancelled_is_recorded_and_close_removes_it() -> None:
    """A hub stopped while its backends start cancels the acquire while the copy is being
    made in its thread: the copy is still recorded, held by nobody, and the owner's close
    (the registry's, once every instance closed) removes it instead of leaving it behind."""
    staging = EtcStaging()
    before = _stagings()
    acquiring = asyncio.ensure_future(staging.acquire())
    await asyncio.sleep(0.01)  # the copy has started in its thread
    acquiring.cancel()
    await wait_for(lambda: staging.root is not None, 30)  # recorded by the thread at its end
    root = staging.root
    assert staging.users == 0 and _stagings() - before == {root}
    staging.close()
    assert not _exists(root) and staging.root is None and _stagings() == before


async def test_an_acquire_after_a_cancelled_one_waits_for_the_same_copy() -> None:
    """Cancelled while its copy is being made, an acquire leaves the copy to the next one,
    which waits for it rather than making a second (that one used to be made beside it, and
    the first, overwritten when both threads finished, stayed on disk until the process
    exited)."""
    staging = EtcStaging()
    before = _stagings()
    acquiring = asyncio.ensure_future(staging.acquire())
    await asyncio.sleep(0.01)  # the copy has started in its thread
    acquiring.cancel()
    held = await staging.acquire()
    assert staging.users == 1 and _stagings() - before == {Path(held.etc).parent}
    staging.release()
    assert _stagings() == before


async def test_aclose_waits_for_a_copy_still_being_made() -> None:
    """The registry closes its staging once every instance closed: a copy whose acquire was
    cancelled and that is still being made is waited for and removed (close() alone found
    nothing yet, and the thread recorded it afterwards, for nobody)."""
    staging = EtcStaging()
    before = _stagings()
    acquiring = asyncio.ensure_future(staging.acquire())
    await asyncio.sleep(0.01)
    acquiring.cancel()
    await staging.aclose()
    assert staging.root is None and _stagings() == before
    again = await staging.acquire()  # still usable: made anew
    assert _exists(Path(again.etc))
    staging.release()
    assert _stagings() == before


def _process(staging: EtcStaging, tmp_path: Path) -> CodeExecutor:
    return ProcessBackend(etc_staging=staging)


def _javascript(staging: EtcStaging, tmp_path: Path) -> CodeExecutor:
    return JavaScriptBackend(etc_staging=staging)


def _rust(staging: EtcStaging, tmp_path: Path) -> CodeExecutor:
    return RustBackend(
        settings=host_rust_settings(), cache_dir=tmp_path / "cache", etc_staging=staging
    )


@pytest.mark.parametrize(
    ("make", "holds", "needs"),
    [(_process, 1, "bwrap"), (_javascript, 1, "deno"), (_rust, 2, "rustc")],
    ids=["process", "js", "rust"],
)
async def test_starts_that_come_while_a_backend_starts_wait_for_that_start(
    make: Callable[[EtcStaging, Path], CodeExecutor], holds: int, needs: str, tmp_path: Path
) -> None:
    """``execute`` starts its backend, so a run that reaches a hub still starting its backends
    starts it a second time. Each such start used to probe again: it took another hold on the
    staged /etc (never given back, so the copy outlived the hub), and one that came after the
    first had taken its hold but before it had found the host view probed bwrap with no
    system directories ("execvp /bin/true: No such file or directory", and the backend stayed
    unavailable). Starts now come every 2 ms for as long as the first takes."""
    found = find_deno() if needs == "deno" else shutil.which(needs)
    require(needs, bool(found and shutil.which("bwrap")), f"{needs} or bwrap is not installed")
    staging = EtcStaging()
    backend = make(staging, tmp_path)
    first = asyncio.ensure_future(backend.start())
    later: list[asyncio.Future[None]] = []
    while not first.done() and len(later) < 2000:
        later.append(asyncio.ensure_future(backend.start()))
        await asyncio.sleep(0.002)
    try:
        await asyncio.gather(first, *later)
        ok, why = backend.available()
        assert ok, why
        assert staging.users == holds  # one hold per confinement, however many starts
    finally:
        await backend.aclose()
    assert staging.users == 0 and staging.root is None  # the last close removed the copy
