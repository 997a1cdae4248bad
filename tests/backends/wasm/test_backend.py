"""The ``wasm`` backend: WASI modules on wasmtime with every limit really applied."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.base import (
    CodeExecutor,
    CompileFailed,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    GuestModule,
    InvalidCode,
    InvalidRequest,
    ModuleBlob,
    OutputChunk,
    PolicyPatch,
    Rejected,
    Source,
    UnsupportedPolicy,
    collect,
    narrow,
)
from backends.wasm import WasmBackend, validate_wasm_bytes
from hub.core.errors import Busy
from tests.backends import wat
from tests.backends.helpers import (
    BOUND_S,
    assert_closed_is_unavailable,
    assert_running_id_is_busy,
    cancel_consumer,
    drain,
    new_request,
    until_running,
)

MIB = 1024 * 1024


@pytest.fixture
async def backend() -> AsyncIterator[WasmBackend]:
    async with WasmBackend() as made:
        yield made


def request(backend: WasmBackend, module: bytes | str, **kw: Any) -> ExecutionRequest:
    data = wat.wasm(module) if isinstance(module, str) else module
    kw.setdefault("payload", GuestModule(data))
    return new_request(backend, language=ExecutionLanguage.WASM, **kw)


async def run(
    backend: WasmBackend, module: bytes | str, workdir: Path | None = None, **kw: Any
) -> tuple[ExecutionResult, list[OutputChunk]]:
    return await drain(backend.execute(request(backend, module, **kw), workdir))


def test_protocol_and_capabilities(backend: WasmBackend) -> None:
    assert isinstance(backend, CodeExecutor)
    caps = backend.capabilities
    assert caps.isolation == "inProcess"
    assert caps.enforces_timeout and caps.enforces_memory and caps.enforces_network
    assert caps.enforces_filesystem and caps.enforces_environment
    assert caps.languages == {ExecutionLanguage.WASM}
    assert "host" not in caps.filesystem_modes


async def test_hello_world_via_wasi(backend: WasmBackend) -> None:
    result, chunks = await run(backend, wat.HELLO)
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0)
    assert result.stdout == b"hello from wasi\n"
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"hello from wasi\n"
    assert not result.has_value
    assert result.metadata is not None and result.metadata.backend == "wasm"


async def test_input_value_round_trip(backend: WasmBackend) -> None:
    given = {"n": 21, "tags": ["a", "é"], "nested": {"ok": True, "none": None}}
    result, _ = await run(backend, wat.ECHO, input=given)
    assert result.status == "completed"
    assert result.value == given
    assert result.stdout == b""  # the value line is taken off the displayed stdout
    assert result.stderr == b"note\n"


async def test_stdin_argv_env_and_exit_code(backend: WasmBackend) -> None:
    from backends.base import EnvironmentPolicy

    policy = narrow(
        backend.default_policy.replace(environment=EnvironmentPolicy.allow_list(["GREETING"])),
        None,
    )
    result, _ = await run(
        backend, wat.ARGS_ENV_EXIT3, argv=("one", "two"), env={"GREETING": "hi"}, policy=policy
    )
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 3)
    assert result.stdout == b"module.wasm\x00one\x00two\x00GREETING=hi\x00"
    echoed, _ = await run(backend, wat.ECHO, stdin=b"raw bytes\n")
    assert echoed.stdout == b"raw bytes\n" and not echoed.has_value


async def test_hub_environment_is_invisible(
    backend: WasmBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_SECRET", "do-not-leak")
    result, _ = await run(backend, wat.ARGS_ENV_EXIT3)
    assert b"AGORA_SECRET" not in result.stdout
    assert result.stdout == b"module.wasm\x00"


async def test_environment_outside_the_allow_list_is_rejected(backend: WasmBackend) -> None:
    with pytest.raises(Rejected):
        await collect(backend.execute(request(backend, wat.HELLO, env={"X": "1"}), None))


async def test_infinite_loop_is_stopped_by_the_timeout(backend: WasmBackend) -> None:
    async with asyncio.timeout(BOUND_S):
        result, _ = await run(backend, wat.INFINITE_LOOP, timeout_ms=300)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert result.duration_ms >= 300
    assert any(d.code == "timeout" for d in result.diagnostics)


async def test_sleeping_in_a_host_call_is_stopped_too(backend: WasmBackend) -> None:
    async with asyncio.timeout(BOUND_S):  # far below the hour: the sleep was interrupted
        result, _ = await run(backend, wat.SLEEP_AN_HOUR, timeout_ms=300)
    assert (result.status, result.reason) == ("failed", "timeout")
    slept, _ = await run(backend, wat.SLEEP_BRIEFLY)  # and a short sleep still sleeps
    assert slept.status == "completed" and slept.stdout == b"slept\n"


async def test_memory_growing_module_is_stopped_by_the_cap(backend: WasmBackend) -> None:
    cap = 8 * MIB
    policy = narrow(backend.default_policy, PolicyPatch(memory_bytes=cap))
    result, _ = await run(backend, wat.GROW_MEMORY, policy=policy)
    assert (result.status, result.reason) == ("failed", "memoryLimit")
    assert any(d.code == "memoryLimit" and str(cap) in d.message for d in result.diagnostics)


async def test_the_memory_cap_is_enforced_at_the_stated_size(backend: WasmBackend) -> None:
    """The guest reports (as its exit code) how many 64 KiB pages it could grow to: exactly
    the cap's, so a cap enforced at any other size (say 16 times it) fails here."""
    cap = 4 * MIB
    policy = narrow(backend.default_policy, PolicyPatch(memory_bytes=cap))
    result, _ = await run(backend, wat.GROW_MEMORY_REPORT, policy=policy)
    assert result.exit_code == cap // (64 * 1024), result
    assert (result.status, result.reason) == ("failed", "memoryLimit")


async def test_module_needing_more_than_the_cap_fails_cleanly(backend: WasmBackend) -> None:
    policy = narrow(backend.default_policy, PolicyPatch(memory_bytes=8 * MIB))
    result, _ = await run(backend, wat.BIG_INITIAL_MEMORY, policy=policy)
    assert (result.status, result.reason) == ("failed", "memoryLimit")
    assert "instantiated" in result.diagnostics[0].message


async def test_a_trap_is_a_failed_result_with_the_reason(backend: WasmBackend) -> None:
    result, _ = await run(backend, wat.DIVIDE_BY_ZERO)
    assert (result.status, result.reason, result.exit_code) == ("failed", "error", -1)
    assert any(d.code == "trap" and "divide by zero" in d.message for d in result.diagnostics)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "tooShort"),
        (b"\x00asm", "tooShort"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "badMagic"),
        (b"\x00asm\x01\x00\x00\x00" + b"\x00" * 64, "tooLarge"),
    ],
)
def test_validate_wasm_bytes_refuses(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidCode) as caught:
        validate_wasm_bytes(data, max_bytes=64)
    assert caught.value.details["reason"] == reason


async def test_a_refused_module_never_compiles(backend: WasmBackend) -> None:
    with pytest.raises(InvalidCode):
        await collect(backend.execute(request(backend, b"#!/bin/sh\necho pwned\n"), None))
    assert backend.cache.misses == 0 and len(backend.cache) == 0


async def test_a_module_that_does_not_compile_is_compile_failed(backend: WasmBackend) -> None:
    broken = b"\x00asm\x01\x00\x00\x00\x01\xff\xff"
    result, _ = await run(backend, broken)
    assert (result.status, result.reason) == ("failed", "compileFailed")


async def test_a_module_without_start_is_refused(backend: WasmBackend) -> None:
    with pytest.raises(InvalidCode):
        await collect(backend.execute(request(backend, wat.NO_START), None))


async def test_read_only_preopen_reads_but_cannot_write(
    backend: WasmBackend, tmp_path: Path
) -> None:
    (tmp_path / "data.txt").write_text("from the workspace\n")
    policy = narrow(
        backend.default_policy, PolicyPatch(filesystem=FilesystemPolicy.workspace_read_only())
    )
    result, _ = await run(backend, wat.READ_THEN_WRITE, tmp_path, policy=policy)
    assert result.stdout == b"from the workspace\n"
    assert (result.status, result.exit_code) == ("failed", 63)  # WASI errno 63: EPERM
    assert not (tmp_path / "out.txt").exists()


async def test_read_write_preopen_writes(backend: WasmBackend, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("x\n")
    result, _ = await run(backend, wat.READ_THEN_WRITE, tmp_path)
    assert (result.status, result.exit_code) == ("completed", 0)
    assert (tmp_path / "out.txt").read_text() == "written\n"


async def test_read_access_instance_never_writes(tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("x\n")
    async with WasmBackend("wasm-ro", access="read") as ro:
        with pytest.raises(Rejected):  # the instance cannot be widened to read-write
            narrow(
                ro.default_policy,
                PolicyPatch(filesystem=FilesystemPolicy.workspace_read_write()),
            )
        result, _ = await run(ro, wat.READ_THEN_WRITE, tmp_path)
        assert result.exit_code == 63
    assert not (tmp_path / "out.txt").exists()


async def test_no_filesystem_means_no_preopen(backend: WasmBackend, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("secret\n")
    policy = narrow(backend.default_policy, PolicyPatch(filesystem=FilesystemPolicy.none()))
    result, _ = await run(backend, wat.READ_THEN_WRITE, tmp_path, policy=policy)
    assert result.stdout == b"" and result.exit_code == 108  # 100 + EBADF: no fd 3


async def test_filesystem_modes_it_cannot_provide_are_refused(backend: WasmBackend) -> None:
    policy = backend.default_policy.replace(filesystem=FilesystemPolicy.host())
    with pytest.raises(UnsupportedPolicy):
        await collect(backend.execute(request(backend, wat.HELLO, policy=policy), None))


async def test_source_payload_is_invalid(backend: WasmBackend) -> None:
    bad = ExecutionRequest(
        exec_id="src",
        language=ExecutionLanguage.WASM,
        payload=Source("(module)"),
        policy=backend.default_policy,
    )
    with pytest.raises(InvalidRequest):
        await collect(backend.execute(bad, None))


async def test_second_run_skips_compilation(backend: WasmBackend) -> None:
    # Seen in the cache's counters and the metadata, not in timings (bench/sandbox_bench.py).
    module = wat.wasm(wat.HELLO)
    cold, _ = await run(backend, module)
    warm, _ = await run(backend, module)
    assert cold.metadata is not None and not cold.metadata.warm
    assert warm.metadata is not None and warm.metadata.warm
    assert (backend.cache.misses, backend.cache.hits) == (1, 1)
    assert warm.stdout == cold.stdout


async def test_module_cache_is_bounded() -> None:
    async with WasmBackend(cache_entries=2) as small:
        for i in range(4):
            await run(small, f'(module (func (export "_start")) (func (export "f{i}")))')
        assert len(small.cache) == 2


async def test_blob_payload_is_fetched_checked_and_cached(backend: WasmBackend) -> None:
    module = wat.wasm(wat.HELLO)
    digest = hashlib.sha256(module).hexdigest()

    class Blobs:
        def __init__(self) -> None:
            self.fetched = 0

        async def get(self, sha256: str) -> bytes:
            self.fetched += 1
            return {digest: module, "0" * 64: b"other"}[sha256]

    blobs = Blobs()
    async with WasmBackend(blobs=blobs) as with_blobs:
        blob_request = request(with_blobs, b"", payload=ModuleBlob(digest))
        for _ in range(2):
            result = await collect(with_blobs.execute(blob_request, None))
            assert result.stdout == b"hello from wasi\n"
            blob_request = request(with_blobs, b"", payload=ModuleBlob(digest))
        assert blobs.fetched == 1  # the second run is a cache hit
        with pytest.raises(InvalidRequest):  # bytes that do not match the hash
            await collect(
                with_blobs.execute(request(with_blobs, b"", payload=ModuleBlob("0" * 64)), None)
            )
    with pytest.raises(InvalidRequest):  # no blob store configured
        await collect(backend.execute(request(backend, b"", payload=ModuleBlob(digest)), None))


async def test_output_is_capped_and_the_guest_never_blocks(backend: WasmBackend) -> None:
    result, chunks = await run(backend, wat.FLOOD, timeout_ms=500, max_stdout=1000)
    assert result.reason == "timeout"
    assert result.stdout_truncated and len(result.stdout) == 1000
    assert result.stdout_total > 1000 * 100
    assert sum(len(c.data) for c in chunks) == 1000


async def test_cancel_interrupts_a_running_module(backend: WasmBackend) -> None:
    req = request(backend, wat.INFINITE_LOOP, timeout_ms=30_000)
    task = asyncio.create_task(collect(backend.execute(req, None)))
    await until_running(backend, req.exec_id)
    async with asyncio.timeout(BOUND_S):  # far below the 30 s timeout: the cancel stopped it
        assert await backend.cancel(req.exec_id)
        result = await task
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)
    assert not await backend.cancel(req.exec_id)
    assert not await backend.cancel("unknown")


async def test_cancelled_consumer_stops_the_module(backend: WasmBackend) -> None:
    req = request(backend, wat.INFINITE_LOOP, timeout_ms=30_000)
    await cancel_consumer(backend, req, settle_s=0.2)
    # The id is free again once the guest is gone: a new run with it is admitted.
    result, _ = await run(backend, wat.HELLO, exec_id=req.exec_id)
    assert result.status == "completed"


async def test_a_running_id_is_busy(backend: WasmBackend) -> None:
    req = request(backend, wat.INFINITE_LOOP, timeout_ms=30_000)
    await assert_running_id_is_busy(backend, req, settle_s=0.1)


async def test_concurrent_runs(backend: WasmBackend) -> None:
    results = await asyncio.gather(
        *(collect(backend.execute(request(backend, wat.ECHO, input=i), None)) for i in range(6))
    )
    assert [r.value for r in results] == list(range(6))


async def test_closed_backend_is_unavailable() -> None:
    made = WasmBackend()
    await assert_closed_is_unavailable(made, request(made, wat.HELLO))


async def test_admit_holds_a_slot_of_the_cap() -> None:
    """``admit`` counts against ``max_concurrent`` until its run takes the slot or it is
    released: what the cap would refuse is refused before the runtime writes anything."""
    async with WasmBackend(max_concurrent=2) as made:
        first = await made.admit(request(made, wat.HELLO, exec_id="a"))
        second = await made.admit(request(made, wat.HELLO, exec_id="b"))
        with pytest.raises(Busy) as caught:
            await made.admit(request(made, wat.HELLO, exec_id="c"))
        assert caught.value.details["limit"] == 2
        with pytest.raises(Busy):  # a direct execute counts the admitted slots too
            await collect(made.execute(request(made, wat.HELLO, exec_id="d"), None))
        result = await collect(made.execute(request(made, wat.HELLO, exec_id="a"), None))
        assert result.status == "completed"  # the admitted run took its slot
        first.release()  # a no-op now: the run had taken it
        second.release()
        third = await made.admit(request(made, wat.HELLO, exec_id="c"))
        assert third.held


async def test_admit_refuses_a_module_that_does_not_compile(backend: WasmBackend) -> None:
    broken = b"\x00asm\x01\x00\x00\x00\x01\xff\xff"
    with pytest.raises(CompileFailed) as caught:
        await backend.admit(request(backend, broken))
    assert caught.value.details["execCode"] == "compileFailed"
    with pytest.raises(InvalidCode):
        await backend.admit(request(backend, wat.NO_START))
    with pytest.raises(InvalidCode):
        await backend.admit(request(backend, b"#!/bin/sh\necho pwned\n"))
    # Nothing is held by a refused admission: the whole cap is still there.
    held = [await backend.admit(request(backend, wat.HELLO, exec_id=f"x{i}")) for i in range(8)]
    assert all(a.held for a in held)
