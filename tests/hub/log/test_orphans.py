"""Issue #11: a crash between storing a publish's blob and committing its event leaves no
orphan. Each publish's new blob is guarded by a durable intent (hub.log.base.BlobIntent); the
sweep a start runs (:meth:`hub.workspaces.Workspaces.sweep_orphans`) removes the blob of an
intent whose event never landed, and keeps one whose event did or that someone else took up
meanwhile. On every store kind (SQLite with file blobs, PostgreSQL), like the conformance suite.
The runtime's blobs (a run's artifacts, a guest module sent whole) are guarded the same way:
the last tests crash a real in-process runtime between storing them and appending.

The crash is injected in-process: the store's ``append`` raises a ``BaseException`` (as a
SIGKILL would end the publish: nothing after it runs), before or after the real append; then a
new store and a new Workspaces over the same storage play the restarted hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import hub.log.postgres as pg_module
from backends.base import (
    Admission,
    BackendCapabilities,
    ExecutionEvent,
    ExecutionIsolation,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    SandboxPolicy,
)
from hub.core.capability import Capability
from hub.core.errors import Conflict, Unavailable
from hub.core.events import ArtifactPublished, Event, ExecRequested, FileWritten, FileWrittenPayload
from hub.core.records import AppendResult
from hub.core.validation import Limits
from hub.core.wire.frames import Exec
from hub.log.base import BlobIntent, EventStore
from hub.log.intents import ORPHAN_GRACE_S
from hub.log.postgres import PostgresEventStore
from hub.runtime import BackendInstance, BackendRegistry, Runtime, RuntimeSettings
from hub.workspaces import Workspaces

LIMITS = Limits(blob_threshold=16)
CONTENT = "content over the blob threshold, stored as a blob " * 4
SHA = hashlib.sha256(CONTENT.encode()).hexdigest()


class Crash(BaseException):
    """The process dying where it is raised (nothing of the publish runs after it)."""


def write(path: str, text: str = CONTENT) -> FileWritten:
    return FileWritten(payload=FileWrittenPayload(path=path, text=text))


def crash_append(store: EventStore, monkeypatch: pytest.MonkeyPatch, *, after: bool) -> None:
    """Make ``store.append`` die before it writes (``after`` false) or once it committed."""
    real = store.append

    async def append(workspace: str, drafts: Sequence[Event], **kw: Any) -> AppendResult:
        if after:
            await real(workspace, drafts, **kw)
        raise Crash

    monkeypatch.setattr(store, "append", append)


async def stored(store: EventStore) -> set[str]:
    return {sha async for sha, _, _ in store.blobs.list()}


async def crashed_publish(
    make_store: Callable[[str], EventStore],
    monkeypatch: pytest.MonkeyPatch,
    *,
    after: bool,
    workspace: str = "w",
) -> None:
    async with make_store("main") as store:
        with monkeypatch.context() as m:
            crash_append(store, m, after=after)
            with pytest.raises(Crash):
                await Workspaces(store, limits=LIMITS).publish(
                    workspace, [write("big.txt")], producer="alice"
                )
        assert SHA in await stored(store)  # stored before the append: the crash's window


async def test_a_crash_before_the_append_leaves_a_blob_the_sweep_removes(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    await crashed_publish(make_store, monkeypatch, after=False)
    async with make_store("main") as store:  # the restarted hub
        ws = Workspaces(store, limits=LIMITS)
        assert await store.head("w") is None  # no event references the blob
        assert await ws.sweep_orphans(before=time.time()) == 1
        assert SHA not in await stored(store)
        assert not await store.blobs.has(SHA)
        assert await ws.stored_bytes("w") == 0  # the quota counts nothing of it
        assert await store.blobs.intents(math.inf) == ()
        assert await ws.sweep_orphans(before=time.time()) == 0  # settled: nothing left to do
        # The same content published afterwards is stored again, whole.
        await ws.publish("w", [write("big.txt")], producer="alice")
        assert await store.blobs.get(SHA) == CONTENT.encode()


async def test_a_crash_after_the_append_committed_keeps_the_blob(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    await crashed_publish(make_store, monkeypatch, after=True)
    async with make_store("main") as store:
        ws = Workspaces(store, limits=LIMITS)
        assert await ws.sweep_orphans(before=time.time()) == 0
        assert (await ws.files("w"))["big.txt"].blob == SHA
        assert await store.blobs.get(SHA) == CONTENT.encode()
        assert await ws.stored_bytes("w") == len(CONTENT)
        assert await store.blobs.intents(math.inf) == ()  # the intent is settled


@pytest.mark.parametrize("taken_up_by", ["publish", "upload"])
async def test_a_blob_another_workspace_took_up_meanwhile_is_kept(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch, taken_up_by: str
) -> None:
    """Blobs are content-addressed and shared: the crashed publish's content published to
    (or uploaded for) another workspace before the sweep stays, for that workspace."""
    await crashed_publish(make_store, monkeypatch, after=False, workspace="a")
    async with make_store("main") as store:
        ws = Workspaces(store, limits=LIMITS)
        if taken_up_by == "publish":
            await ws.publish("b", [write("same.txt")], producer="bob")
        else:
            data = CONTENT.encode()
            at = await store.blobs.upload_offset(SHA, len(data), uploader="bob")
            await store.blobs.write_chunk(SHA, len(data), at, data[at:], uploader="bob")
            await store.blobs.commit(SHA, len(data), uploader="bob")
            await store.blobs.grant("b", SHA, len(data), "bob")
        assert await ws.sweep_orphans(before=time.time()) == 0
        assert await store.blobs.get(SHA) == CONTENT.encode()
        assert await ws.stored_bytes("b") == len(CONTENT)
        assert await ws.stored_bytes("a") == 0
        assert await store.blobs.intents(math.inf) == ()


async def test_a_young_intent_is_left_for_a_later_sweep(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may have the publish in flight: a sweep takes only intents older than
    its ``before`` (the hub passes now minus ORPHAN_GRACE_S)."""
    await crashed_publish(make_store, monkeypatch, after=False)
    async with make_store("main") as store:
        ws = Workspaces(store, limits=LIMITS)
        (intent,) = await store.blobs.intents(math.inf)
        assert await ws.sweep_orphans(before=intent.stamp / 1e6) == 0
        assert await store.blobs.has(SHA)
        assert await ws.sweep_orphans(before=time.time()) == 1
        assert not await store.blobs.has(SHA)


async def test_a_batch_refused_after_its_blob_was_stored_removes_it_at_once(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refusing the append (a typed client error: nothing was appended) is
    settled by the publish itself, no restart needed."""

    async def refuse(workspace: str, drafts: Sequence[Event], **kw: Any) -> AppendResult:
        assert await store.blobs.has(SHA)
        raise Conflict("refused by the store")

    with monkeypatch.context() as m:
        m.setattr(store, "append", refuse)
        with pytest.raises(Conflict):
            await Workspaces(store, limits=LIMITS).publish("w", [write("big.txt")], producer="a")
    assert not await store.blobs.has(SHA)
    assert await store.blobs.intents(math.inf) == ()


async def test_a_committed_publish_leaves_no_intent(store: EventStore) -> None:
    ws = Workspaces(store, limits=LIMITS)
    await ws.publish("w", [write("one.txt")], producer="alice")
    await ws.publish("w", [write("two.txt")], producer="alice")  # the stored blob, touched
    assert await store.blobs.intents(math.inf) == ()
    assert await ws.sweep_orphans(before=math.inf) == 0
    assert await store.blobs.get(SHA) == CONTENT.encode()


async def test_a_committed_publish_whose_intent_cannot_be_dropped_still_succeeds(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the append committed, the publish is done: a store hiccup dropping the intent
    must not answer the agent ``unavailable`` (a retry without an id would publish twice).
    The intent left behind is settled by the next sweep, which finds the event."""

    async def hiccup(intent: BlobIntent) -> None:
        raise Unavailable("the intent store hiccuped")

    ws = Workspaces(store, limits=LIMITS)
    with monkeypatch.context() as m:
        m.setattr(store.blobs, "settle", hiccup)
        result = await ws.publish("w", [write("big.txt")], producer="alice")
    assert result.events[0].seq == 1
    (intent,) = await store.blobs.intents(math.inf)
    assert intent.event_id == result.events[0].id
    assert await ws.sweep_orphans(before=math.inf) == 0
    assert await store.blobs.intents(math.inf) == ()
    assert await store.blobs.get(SHA) == CONTENT.encode()


@pytest.mark.parametrize("store_kind", ["postgres"], indirect=True)  # nodes share only it
async def test_a_node_whose_clock_is_behind_keeps_its_publish_in_flight(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hub nodes on one PostgreSQL: node B's clock runs 10 minutes behind node A's. B
    has just stored a publish's blob (its intent stamped by B's clock) and is about to
    commit; A's periodic sweep (its own clock, less ORPHAN_GRACE_S) must not take that
    intent for a crash's. The grace is measured on the database's clock."""
    async with make_store("main") as node_a, make_store("main") as node_b:
        assert isinstance(node_b, PostgresEventStore)
        behind = 600 * 1_000_000_000
        real_ns = time.time_ns
        with monkeypatch.context() as m:
            m.setattr(pg_module, "time", SimpleNamespace(time_ns=lambda: real_ns() - behind))
            intent = await node_b.blobs.intend("w", "event-in-flight", SHA, len(CONTENT))
            await node_b.blobs.put(CONTENT.encode(), stamp=intent.stamp)
        ws_a = Workspaces(node_a, limits=LIMITS)
        assert await ws_a.sweep_orphans(before=time.time() - ORPHAN_GRACE_S) == 0
        assert await node_a.blobs.get(SHA) == CONTENT.encode()
        assert await node_a.blobs.intents(math.inf) == (intent,)


async def test_a_publish_stalled_past_the_grace_stores_its_swept_blob_again(
    store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep cannot tell a crashed publish from one stalled longer than the grace (a
    writer queue, a long store outage): it removes the blob. When such a publish commits
    after all, it stores the content again, so no committed event references a missing
    blob."""
    import hub.workspaces as ws_module

    ws = Workspaces(store, limits=LIMITS)
    real_append = store.append
    real_time = time.time

    async def stalled(workspace: str, drafts: Sequence[Event], **kw: Any) -> AppendResult:
        # Meanwhile another sweep (another process's, or a later one of this hub) takes the
        # intent for a crash's: the blob goes.
        assert await Workspaces(store, limits=LIMITS).sweep_orphans(before=math.inf) == 1
        assert not await store.blobs.has(SHA)
        monkeypatch.setattr(ws_module.time, "time", lambda: real_time() + ORPHAN_GRACE_S)
        return await real_append(workspace, drafts, **kw)

    monkeypatch.setattr(store, "append", stalled)
    await ws.publish("w", [write("big.txt")], producer="alice")
    assert (await ws.files("w"))["big.txt"].blob == SHA
    assert await store.blobs.get(SHA) == CONTENT.encode()


# -- the runtime's blobs: a run's artifacts, a guest module sent whole -------------------------
# The runtime stores them before appending the events that reference them, like a publish's
# inline content, so the same intents guard them (hub.log.intents.BlobStaging).

CAP = Capability(
    agent="alice",
    workspaces=("*",),
    rights=("read", "exec"),
    backends=("*",),
    expires_at=2**40,
    issued_at=0,
    token_id="t",
)
ARTIFACT = b"an artifact the run wrote, stored by the hub as a blob\n" * 8
ARTIFACT_SHA = hashlib.sha256(ARTIFACT).hexdigest()
MODULE = b"\x00asm\x01\x00\x00\x00 a guest module the agent sent whole"
MODULE_SHA = hashlib.sha256(MODULE).hexdigest()


class WritesArtifact:
    """A backend whose every run writes ``out/a.bin`` (:data:`ARTIFACT`) into its workdir."""

    name = "fake"
    capabilities = BackendCapabilities(
        isolation=ExecutionIsolation.IN_PROCESS,
        enforces_network=True,
        enforces_filesystem=True,
        enforces_environment=True,
        enforces_timeout=True,
        languages=frozenset({ExecutionLanguage.COMMAND, ExecutionLanguage.WASM}),
    )
    default_policy = SandboxPolicy(filesystem=FilesystemPolicy.workspace_read_write())

    def available(self) -> tuple[bool, str]:
        return True, ""

    async def start(self) -> None:
        return None

    async def probe(self) -> tuple[bool, str]:
        return True, ""

    async def admit(self, request: ExecutionRequest) -> Admission:
        return Admission(None, request.exec_id)

    async def execute(
        self, request: ExecutionRequest, workdir: Path | None, access: object = None
    ) -> AsyncIterator[ExecutionEvent]:
        if workdir is not None:
            (workdir / "out").mkdir(exist_ok=True)
            (workdir / "out" / "a.bin").write_bytes(ARTIFACT)
        yield ExecutionResult(status="completed", reason="exit", exit_code=0)

    async def cancel(self, exec_id: str) -> bool:
        return False

    async def aclose(self) -> None:
        return None

    def abandon(self) -> None:
        return None


def crash_append_of(store: EventStore, monkeypatch: pytest.MonkeyPatch, kind: type) -> None:
    """Make ``store.append`` die (before it writes) on a batch holding an event of ``kind``."""
    real = store.append

    async def append(workspace: str, drafts: Sequence[Event], **kw: Any) -> AppendResult:
        if any(isinstance(d, kind) for d in drafts):
            raise Crash
        return await real(workspace, drafts, **kw)

    monkeypatch.setattr(store, "append", append)


@contextlib.asynccontextmanager
async def runtime_on(store: EventStore) -> AsyncIterator[tuple[Runtime, asyncio.Task[None]]]:
    """A running runtime over ``store`` (one ``WritesArtifact`` instance); stopped after."""
    workspaces = Workspaces(store, limits=LIMITS)
    registry = BackendRegistry([BackendInstance("fake", "process", "read-write", WritesArtifact())])
    runtime = Runtime(workspaces, registry, RuntimeSettings())
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop))
    await asyncio.sleep(0)
    try:
        yield runtime, task
    finally:
        stop.set()
        with contextlib.suppress(BaseExceptionGroup):  # a crash the test checked already
            await task


async def test_a_crash_before_a_runs_artifacts_are_appended_leaves_a_blob_the_sweep_removes(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_store("main") as store, runtime_on(store) as (runtime, task):
        with monkeypatch.context() as m:
            crash_append_of(store, m, ArtifactPublished)
            run = Exec(workspace="w", source="x", artifacts=["out/*.bin"])
            await runtime.exec("w", run, capability=CAP)
            with pytest.raises(BaseExceptionGroup) as crashed:
                await task  # the crash ends the runtime, as it ends the process
        assert crashed.value.subgroup(Crash) is not None
        assert ARTIFACT_SHA in await stored(store)  # stored before the append: the window
    async with make_store("main") as store:  # the restarted hub
        ws = Workspaces(store, limits=LIMITS)
        assert await ws.sweep_orphans(before=time.time()) == 1
        assert not await store.blobs.has(ARTIFACT_SHA)
        assert await store.blobs.intents(math.inf) == ()


async def test_a_runs_committed_artifacts_leave_no_intent(store: EventStore) -> None:
    async with runtime_on(store) as (runtime, _):
        run = Exec(workspace="w", source="x", artifacts=["out/*.bin"])
        exec_id = await runtime.exec("w", run, capability=CAP)
        result = await runtime.result("w", exec_id, capability=CAP)
    assert [a.sha256 for a in result.artifacts] == [ARTIFACT_SHA]
    assert await store.blobs.intents(math.inf) == ()
    assert await Workspaces(store, limits=LIMITS).sweep_orphans(before=math.inf) == 0
    assert await store.blobs.get(ARTIFACT_SHA) == ARTIFACT


async def test_a_crash_before_a_sent_modules_request_is_appended_leaves_nothing(
    make_store: Callable[[str], EventStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest module sent whole is stored before its ``execRequested``; a crash between
    leaves a blob the sweep removes, and no grant (given once the request committed)."""
    async with make_store("main") as store, runtime_on(store) as (runtime, _):
        with monkeypatch.context() as m:
            crash_append_of(store, m, ExecRequested)
            with pytest.raises(Crash):
                await runtime.exec("w", Exec(workspace="w", module=MODULE), capability=CAP)
        assert MODULE_SHA in await stored(store)
    async with make_store("main") as store:
        ws = Workspaces(store, limits=LIMITS)
        assert await ws.sweep_orphans(before=time.time()) == 1
        assert not await store.blobs.has(MODULE_SHA)
        assert await store.blobs.grants("w") == {}
        assert await store.blobs.intents(math.inf) == ()


async def test_a_sent_module_whose_request_committed_is_kept_and_granted(
    store: EventStore,
) -> None:
    async with runtime_on(store) as (runtime, _):
        exec_id = await runtime.exec("w", Exec(workspace="w", module=MODULE), capability=CAP)
        await runtime.result("w", exec_id, capability=CAP)
    assert await store.blobs.intents(math.inf) == ()
    assert await Workspaces(store, limits=LIMITS).sweep_orphans(before=math.inf) == 0
    assert await store.blobs.get(MODULE_SHA) == MODULE
    assert await store.blobs.grants("w") == {MODULE_SHA: len(MODULE)}
