"""hub/runtime/runtime.py and execution.py in-process, with scripted backends: retention, the
cap, a backend that ignores kill, a backend that refuses at run time, shutdown, and recovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from backends.base import (
    Admission,
    BackendCapabilities,
    ExecutionEvent,
    ExecutionIsolation,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    OutputChunk,
    Rejected,
    SandboxPolicy,
)
from hub.core.capability import Capability
from hub.core.errors import Busy, Forbidden, Unavailable
from hub.core.events import (
    ExecDisposed,
    ExecFinished,
    ExecOutput,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    FileWritten,
    FileWrittenPayload,
)
from hub.core.execution.capabilities import WorkspaceMode
from hub.core.wire.frames import Exec
from hub.log.factory import open_store
from hub.runtime import BackendInstance, BackendRegistry, Runtime, RuntimeSettings
from hub.runtime.access import LogAccess
from hub.workspaces import Workspaces

CAP = Capability(
    agent="alice",
    workspaces=("*",),
    rights=("read", "exec"),
    backends=("*",),
    expires_at=2**40,
    issued_at=0,
    token_id="t",
)


class Scripted:
    """A backend whose source says what to do: ``out:TEXT``, ``hang``, ``refuse``, ``ok``."""

    def __init__(self, *, obey_cancel: bool = True, workspace: WorkspaceMode = "files") -> None:
        self.obey_cancel = obey_cancel
        self.closed: list[str] = []
        self.given: list[tuple[Path | None, object]] = []
        """What each run got from the runtime: ``(workdir, access)``."""
        self._stops: dict[str, asyncio.Event] = {}
        self.capabilities = self.capabilities.replace(
            workspace=workspace,
            host_functions=frozenset({"read_file"})
            if workspace == "hostFunctions"
            else frozenset(),
        )

    name = "fake"
    capabilities = BackendCapabilities(
        isolation=ExecutionIsolation.IN_PROCESS,
        enforces_network=True,
        enforces_filesystem=True,
        enforces_environment=True,
        enforces_timeout=True,
        languages=frozenset({ExecutionLanguage.COMMAND}),
    )
    default_policy = SandboxPolicy()

    def available(self) -> tuple[bool, str]:
        return True, ""

    async def start(self) -> None:
        return None

    async def probe(self) -> tuple[bool, str]:
        return True, ""

    async def admit(self, request: ExecutionRequest) -> Admission:
        return Admission(None, request.exec_id)  # no cap: the hub's is tested

    async def execute(
        self, request: ExecutionRequest, workdir: Path | None, access: object = None
    ) -> AsyncIterator[ExecutionEvent]:
        source = request.source or ""
        self.given.append((workdir, access))
        stop = self._stops[request.exec_id] = asyncio.Event()
        try:
            if source == "refuse":
                raise Rejected("not today", field="source")
            if source.startswith("out:"):
                yield OutputChunk("stdout", source[4:].encode())
            if source == "hang":
                yield OutputChunk("stdout", b"hanging\n")
                await stop.wait()
                yield ExecutionResult(status="cancelled", reason="killed", exit_code=130)
                return
            yield ExecutionResult(status="completed", reason="exit", exit_code=0)
        finally:
            self.closed.append(request.exec_id)
            self._stops.pop(request.exec_id, None)

    async def cancel(self, exec_id: str) -> bool:
        stop = self._stops.get(exec_id)
        if stop is None or not self.obey_cancel:
            return False
        stop.set()
        return True

    async def aclose(self) -> None:
        return None

    def abandon(self) -> None:
        return None


class Rig:
    def __init__(self, workspaces: Workspaces, runtime: Runtime, backend: Scripted) -> None:
        self.workspaces = workspaces
        self.runtime = runtime
        self.backend = backend
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self, source: str, exec_id: str | None = None, **fields: Any) -> Any:
        exec_id = await self.runtime.exec(
            "w", Exec(workspace="w", source=source, exec_id=exec_id, **fields), capability=CAP
        )
        return await self.runtime.result("w", exec_id, capability=CAP)

    async def events(self) -> list[Any]:
        return [e async for e in self.workspaces.store.read("w")]


async def make_rig(tmp_path: Path, backend: Scripted, **settings: Any) -> AsyncIterator[Rig]:
    async with open_store(None, tmp_path / "data") as store:
        workspaces = Workspaces(store)
        registry = BackendRegistry([BackendInstance("fake", "process", "read-write", backend)])
        runtime = Runtime(workspaces, registry, RuntimeSettings(**settings))
        rig = Rig(workspaces, runtime, backend)
        await runtime.recover()
        rig.task = asyncio.create_task(runtime.run(rig.stop))
        await asyncio.sleep(0)
        try:
            yield rig
        finally:
            rig.stop.set()
            await rig.task


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for r in make_rig(tmp_path, Scripted(), retention_keep=2, retention_window_s=0):
        yield r


async def test_a_short_run_is_journaled_in_two_commits(rig: Rig) -> None:
    batches: list[list[str]] = []
    rig.workspaces.add_listener(lambda _w, batch: batches.append([e.kind for e in batch]))
    result = await rig.run("out:hi", exec_id="a")
    events = await rig.events()
    assert (result.status, result.stdout) == ("completed", "aGk=")  # base64 by default
    assert [type(e) for e in events] == [ExecRequested, ExecStarted, ExecOutput, ExecFinished]
    assert batches == [["execRequested"], ["execStarted", "execOutput", "execFinished"]]
    # Both name the node that accepted and ran it: a survivor closes what it leaves open.
    requested, started = events[0], events[1]
    assert requested.payload.node == started.payload.node == rig.runtime.node


async def test_retention_prunes_beyond_the_newest(rig: Rig) -> None:
    for i in range(4):
        await rig.run("ok", exec_id=f"r{i}")
    await asyncio.sleep(0.05)
    disposed = [e for e in await rig.events() if isinstance(e, ExecDisposed)]
    assert [(e.payload.exec_id, e.payload.reason, e.producer) for e in disposed] == [
        ("r0", "retention", "hub"),
        ("r1", "retention", "hub"),
    ]
    again = await rig.run("ok", exec_id="r0")  # the id is free again
    assert again.status == "completed"


@pytest.mark.parametrize("mode", ["files", "hostFunctions", "none"])
async def test_what_a_run_gets_follows_the_declared_workspace_mode(
    tmp_path: Path, mode: WorkspaceMode
) -> None:
    backend = Scripted(workspace=mode)
    backend.default_policy = SandboxPolicy(filesystem=FilesystemPolicy.workspace_read_write())
    async for rig in make_rig(tmp_path, backend):
        await rig.workspaces.publish(
            "w",
            [FileWritten(payload=FileWrittenPayload(path="a.txt", text="a"))],
            producer="alice",
            trusted=True,
        )
        result = await rig.run("ok")
        assert result.status == "completed"
    ((workdir, access),) = backend.given
    if mode == "files":
        assert workdir is not None and access is None
        assert result.pushed == 1  # the workspace was pushed into the directory
    elif mode == "hostFunctions":
        assert workdir is None and isinstance(access, LogAccess)
    else:
        assert workdir is None and access is None and result.pushed == 0


async def test_a_refusal_at_run_time_is_recorded(rig: Rig) -> None:
    result = await rig.run("refuse")
    assert (result.status, result.reason) == ("failed", "rejected")
    assert msgspec.to_builtins(result.diagnostics)[0]["message"] == "not today"


async def test_the_cap_and_the_rights(tmp_path: Path) -> None:
    async for rig in make_rig(tmp_path, Scripted(), max_executions=1):
        first = await rig.runtime.exec("w", Exec(workspace="w", source="hang"), capability=CAP)
        with pytest.raises(Busy):
            await rig.runtime.exec("w", Exec(workspace="w", source="ok"), capability=CAP)
        reader = msgspec.structs.replace(CAP, rights=("read",))
        with pytest.raises(Forbidden):
            await rig.runtime.exec("w", Exec(workspace="w", source="ok"), capability=reader)
        other = msgspec.structs.replace(CAP, backends=("nope",))
        with pytest.raises(Forbidden):
            await rig.runtime.exec("w", Exec(workspace="w", source="ok"), capability=other)
        assert await rig.runtime.kill("w", first, capability=CAP) == "cancelled"


async def test_a_backend_that_ignores_kill_is_closed_by_the_runtime(tmp_path: Path) -> None:
    backend = Scripted(obey_cancel=False)
    async for rig in make_rig(tmp_path, backend, stop_grace_s=0.2):
        exec_id = await rig.runtime.exec("w", Exec(workspace="w", source="hang"), capability=CAP)
        await asyncio.sleep(0.1)
        status = await rig.runtime.kill("w", exec_id, capability=CAP)
        result = await rig.runtime.result("w", exec_id, capability=CAP)
        assert status == "cancelled" and exec_id in backend.closed  # its stream was closed
        codes = [d["code"] for d in msgspec.to_builtins(result.diagnostics)]
        assert result.exit_code == 130 and "forcedStop" in codes


async def test_shutdown_records_interrupted_and_refuses_new_work(tmp_path: Path) -> None:
    async for rig in make_rig(tmp_path, Scripted()):
        exec_id = await rig.runtime.exec("w", Exec(workspace="w", source="hang"), capability=CAP)
        await asyncio.sleep(0.1)
        rig.stop.set()
        assert rig.task is not None
        await rig.task
        with pytest.raises(Unavailable):
            await rig.runtime.exec("w", Exec(workspace="w", source="ok"), capability=CAP)
        finished = [e for e in await rig.events() if isinstance(e, ExecFinished)]
        assert [(e.payload.exec_id, e.payload.status, e.payload.reason) for e in finished] == [
            (exec_id, "failed", "interrupted")
        ]


async def test_recovery_closes_open_executions(tmp_path: Path) -> None:
    async with open_store(None, tmp_path / "data") as store:
        workspaces = Workspaces(store)
        await workspaces.publish(
            "w",
            [
                ExecRequested(payload=ExecRequestedPayload(exec_id="ran", backend="fake")),
                ExecStarted(payload=ExecStartedPayload(exec_id="ran", backend="fake")),
                ExecRequested(payload=ExecRequestedPayload(exec_id="queued", backend="fake")),
            ],
            producer="alice",
            trusted=True,
        )
        registry = BackendRegistry([BackendInstance("fake", "process", "read-write", Scripted())])
        runtime = Runtime(workspaces, registry)
        assert await runtime.recover() == 2
        assert await runtime.recover() == 0  # nothing left open
        events = [e async for e in store.read("w")]
    kinds = [(e.kind, getattr(getattr(e, "payload", None), "exec_id", None)) for e in events[3:]]
    assert kinds == [
        ("execOutput", "ran"),
        ("execFinished", "ran"),
        ("execFinished", "queued"),  # never started: no output note
    ]
    assert all(e.producer == "hub" for e in events[3:])


async def wasm_rig(tmp_path: Path, max_concurrent: int) -> AsyncIterator[Rig]:
    from backends.wasm import WasmBackend

    async with open_store(None, tmp_path / "data") as store:
        workspaces = Workspaces(store)
        backend = WasmBackend("wasm", max_concurrent=max_concurrent, blobs=store.blobs)
        registry = BackendRegistry([BackendInstance("wasm", "wasm", "read-write", backend)])
        runtime = Runtime(workspaces, registry, RuntimeSettings())
        rig = Rig(workspaces, runtime, backend)  # type: ignore[arg-type]
        await runtime.recover()
        rig.task = asyncio.create_task(runtime.run(rig.stop))
        await asyncio.sleep(0)
        try:
            yield rig
        finally:
            rig.stop.set()
            await rig.task


async def test_runs_over_a_backends_cap_are_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Issue #11 item 9: 10 parallel wasm runs on a backend capped at 3 — the 7 extras are
    refused with ``busy`` and no ``execRequested`` is written for them; none of the admitted
    ones ends ``failed/rejected``."""
    from tests.backends import wat

    loop = wat.wasm(wat.INFINITE_LOOP)
    async for rig in wasm_rig(tmp_path, max_concurrent=3):
        frames = [
            Exec(workspace="w", module=loop, exec_id=f"e{i}", timeout_ms=30_000) for i in range(10)
        ]
        outcomes = await asyncio.gather(
            *(rig.runtime.exec("w", f, capability=CAP) for f in frames), return_exceptions=True
        )
        admitted = [o for o in outcomes if isinstance(o, str)]
        refused = [o for o in outcomes if isinstance(o, Busy)]
        assert (len(admitted), len(refused)) == (3, 7)
        assert all(e.details.get("limit") == 3 for e in refused)
        requested = [e.payload.exec_id for e in await rig.events() if isinstance(e, ExecRequested)]
        assert sorted(requested) == sorted(admitted)
        for exec_id in admitted:
            assert await rig.runtime.kill("w", exec_id, capability=CAP) == "cancelled"
        # The slots came back: a run after them is admitted and completes.
        hello = Exec(workspace="w", module=wat.wasm(wat.HELLO), exec_id="after")
        await rig.runtime.exec("w", hello, capability=CAP)
        after = await rig.runtime.result("w", "after", capability=CAP)
        assert after.status == "completed"
        finished = [e for e in await rig.events() if isinstance(e, ExecFinished)]
        assert all(e.payload.reason != "rejected" for e in finished)


async def test_a_module_that_does_not_compile_is_refused_with_the_head_unchanged(
    tmp_path: Path,
) -> None:
    from hub.core.execution.errors import CompileFailed

    async for rig in wasm_rig(tmp_path, max_concurrent=2):
        head = await rig.workspaces.store.head("w")
        broken = Exec(workspace="w", module=b"\x00asm\x01\x00\x00\x00\x01\xff\xff")
        with pytest.raises(CompileFailed) as caught:
            await rig.runtime.exec("w", broken, capability=CAP)
        assert caught.value.code == "badRequest"
        assert caught.value.details["execCode"] == "compileFailed"
        assert await rig.workspaces.store.head("w") == head
        assert await rig.events() == []


def test_a_finished_payload_over_the_event_size_is_output_limit() -> None:
    from hub.core.events import ExecFinishedPayload
    from hub.core.validation import Limits
    from hub.runtime.outcome import bounded

    limits = Limits(max_event_bytes=4096)
    small = ExecFinishedPayload(exec_id="a", status="completed", reason="exit", value="x" * 100)
    assert bounded(small, limits) is small
    big = msgspec.structs.replace(small, value="x" * 5000)
    over = bounded(big, limits)
    assert (over.status, over.reason, over.value) == ("failed", "outputLimit", None)
    assert "max_event_bytes" in over.diagnostics[0]["message"]
    deep = msgspec.structs.replace(small, diagnostics=[{"code": "x", "data": [[[[1]]]]}])
    assert bounded(deep, Limits(max_depth=3)).reason == "outputLimit"
