"""What only the ``process`` backend does (backends/process.py); the shared behaviour is in
test_conformance.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from backends.base import (
    EnvironmentPolicy,
    ExecutionLanguage,
    InvalidRequest,
    UnsupportedPolicy,
    host_local,
)
from backends.process import ProcessBackend, probe_network_isolation
from tests.backends.rigs import Listener, Rig

PYTHON = ExecutionLanguage.PYTHON


async def test_python_structured_output(process_rig: Rig) -> None:
    source = (
        "import json, sys\n"
        "data = json.load(sys.stdin)\n"
        "print('working on', data['n'])\n"
        "print(json.dumps({'square': data['n'] ** 2}))\n"
    )
    result = await process_rig.run(source, language=PYTHON, input={"n": 7})
    assert result.status == "completed", result.stderr
    assert result.value == {"square": 49}
    assert result.stdout == b"working on 7\n"


async def test_python_without_json_last_line_has_no_value(process_rig: Rig) -> None:
    result = await process_rig.run("print('hello')", language=PYTHON)
    assert not result.has_value and result.stdout == b"hello\n"


async def test_python_runs_isolated(process_rig: Rig) -> None:
    # -I: no user site, no PYTHON* variables, no script directory on sys.path.
    result = await process_rig.run("import sys; print(sys.flags.isolated)", language=PYTHON)
    assert result.value == 1 and result.stdout == b""  # a JSON last line is the value


async def test_input_is_refused_for_commands(process_rig: Rig) -> None:
    with pytest.raises(InvalidRequest):
        await process_rig.run("cat", input={"a": 1})


async def test_background_children_do_not_outlive_the_run(process_rig: Rig) -> None:
    marker = f"bg-{uuid.uuid4().hex}"
    started = time.monotonic()
    request = process_rig.request(f"sh -c 'sleep 300' {marker} & echo started")
    result = await process_rig.run_request(request)
    assert result.status == "completed" and result.stdout == b"started\n"
    assert time.monotonic() - started < 5
    assert await process_rig.leftovers(request.exec_id, marker) == []


async def test_timeout_sends_sigterm_first() -> None:
    async with ProcessBackend(policy=host_local(), kill_grace_s=5) as backend:
        rig = Rig("process", backend, host_local())
        started = time.monotonic()
        result = await rig.run(
            "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
            timeout_ms=500,
        )
    assert time.monotonic() - started < 3  # it left on SIGTERM, long before the grace ended
    assert result.reason == "timeout" and result.stdout == b"ready\nbye\n"


async def test_sigkill_after_the_grace_period() -> None:
    async with ProcessBackend(policy=host_local(), kill_grace_s=0.3) as backend:
        rig = Rig("process", backend, host_local())
        started = time.monotonic()
        result = await rig.run("trap '' TERM; while :; do :; done", timeout_ms=300)
    elapsed = time.monotonic() - started
    assert result.reason == "timeout" and 0.6 <= elapsed < 3


async def test_missing_program_exits_127(process_rig: Rig) -> None:
    policy = host_local()  # no unshare in front: the spawn itself fails
    result = await process_rig.run("", argv=("no-such-program-here",), policy=policy)
    assert (result.status, result.exit_code) == ("failed", 127)
    assert b"not found" in result.stderr


async def test_environment_is_minimal(process_rig: Rig, tmp_path: Path) -> None:
    result = await process_rig.run("env", workdir=tmp_path)
    names = {line.split(b"=", 1)[0] for line in result.stdout.splitlines()}
    assert names <= {b"PATH", b"HOME", b"LANG", b"PWD", b"SHLVL", b"_", b"OLDPWD"}
    assert f"HOME={tmp_path}".encode() in result.stdout


async def test_scratch_directory_without_workdir(process_rig: Rig) -> None:
    result = await process_rig.run("pwd; echo x > file")
    scratch = Path(result.stdout.decode().strip())
    assert result.status == "completed" and scratch.name.startswith("agora-exec-")
    assert not await asyncio.to_thread(scratch.exists)


async def test_allowed_variable_can_override_path(process_rig: Rig) -> None:
    policy = process_rig.base.replace(environment=EnvironmentPolicy.allow_list(["PATH"]))
    result = await process_rig.run('echo "$PATH"', env={"PATH": "/bin"}, policy=policy)
    assert result.stdout == b"/bin\n"


async def test_source_over_the_argument_limit_is_invalid(process_rig: Rig) -> None:
    with pytest.raises(InvalidRequest):
        await process_rig.run("#" * 200_000)


async def test_network_enabled_reaches_loopback(listener: Listener) -> None:
    # The positive control of the conformance test: the same program does connect when the
    # policy allows the network, so "no connection" there is the namespace's doing.
    async with ProcessBackend(policy=host_local()) as backend:
        rig = Rig("process", backend, host_local())
        language, source = rig.connect_program(listener.port)
        result = await rig.run(source, language=language)
    assert result.status == "completed", result.stderr
    assert listener.accepted == 1


async def test_network_namespace_error_is_visible(process_rig: Rig, listener: Listener) -> None:
    if not process_rig.backend.capabilities.enforces_network:
        pytest.skip("no network namespaces here (covered by the next test)")
    language, source = process_rig.connect_program(listener.port)
    result = await process_rig.run(source, language=language)
    assert b"Network is unreachable" in result.stderr
    assert listener.accepted == 0


async def test_without_network_isolation_disabled_network_is_refused() -> None:
    async with ProcessBackend(network_isolation=False) as backend:
        assert backend.capabilities.enforces_network is False
        assert backend.default_policy.network == "disabled"
        rig = Rig("process", backend, backend.default_policy)
        with pytest.raises(UnsupportedPolicy) as excinfo:
            await rig.run("true")
        assert excinfo.value.details["control"] == "network"
        # Opting in to the network works.
        result = await rig.run("true", policy=host_local())
        assert result.status == "completed"


async def test_probe_is_cached() -> None:
    first = await probe_network_isolation()
    assert await probe_network_isolation() is first


async def test_aclose_stops_running_executions() -> None:
    backend = ProcessBackend(policy=host_local())
    rig = Rig("process", backend, host_local())
    marker = f"aclose-{uuid.uuid4().hex}"
    request = rig.request(f"echo up; exec sh -c 'sleep 30' {marker}")
    events = backend.execute(request, None)
    await anext(events)
    await asyncio.wait_for(backend.aclose(), 5)
    rest = [event async for event in events]
    assert rest[-1].status == "cancelled"  # type: ignore[union-attr]
    assert await rig.leftovers(request.exec_id, marker) == []
