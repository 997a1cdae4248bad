"""What only the ``process`` backend does (backends/process.py); the shared behaviour is in
test_conformance.py, the sandbox escapes in test_escape.py, the bwrap argument list in
test_confine.py."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pytest

from backends.base import (
    BackendUnavailable,
    EnvironmentPolicy,
    ExecutionIsolation,
    ExecutionLanguage,
    FilesystemPolicy,
    InvalidRequest,
    PolicyPatch,
    SandboxPolicy,
    UnsupportedPolicy,
    host_local,
    narrow,
)
from backends.cgroups import HUB_PREFIX, CgroupHost, RunLimits
from backends.process import ProcessBackend, probe_network_isolation
from tests.backends.helpers import BOUND_S
from tests.backends.rigs import Listener, Rig, confined_open
from tests.support.require import require

PYTHON = ExecutionLanguage.PYTHON


def confined_rig(backend: ProcessBackend) -> Rig:
    base = narrow(backend.default_policy, PolicyPatch(network="disabled"))
    return Rig("process", backend, base)


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


async def test_confined_capabilities(process_rig: Rig) -> None:
    caps = process_rig.backend.capabilities
    assert caps.isolation == ExecutionIsolation.NAMESPACE
    assert caps.enforces_filesystem and caps.enforces_network and caps.enforces_memory
    assert "host" not in caps.filesystem_modes and "paths" in caps.filesystem_modes
    # pids and cpu are what the cgroups of this host give: exactly that, no more.
    host = await asyncio.to_thread(CgroupHost.probe)
    controllers = host.controllers if host is not None else frozenset()
    assert caps.enforces_pids == ("pids" in controllers)
    assert caps.enforces_cpu == ("cpu" in controllers)


async def test_runs_as_nobody_in_its_own_pid_namespace(process_rig: Rig) -> None:
    result = await process_rig.run("id -u; id -g; echo $$; ls /proc | grep -c '^[0-9]'")
    uid, gid, pid, count = result.stdout.split()
    assert (uid, gid, pid) == (b"65534", b"65534", b"2")  # 1 is the namespace's init
    assert int(count) <= 4  # init, sh, ls, grep: the hub is not there


async def test_background_children_do_not_outlive_the_run(process_rig: Rig) -> None:
    marker = f"bg-{uuid.uuid4().hex}"
    request = process_rig.request(f"sh -c 'sleep 300' {marker} & echo started")
    async with asyncio.timeout(BOUND_S):  # far below the child's 300 s: it did not wait for it
        result = await process_rig.run_request(request)
    assert result.status == "completed" and result.stdout == b"started\n"
    assert await process_rig.leftovers(request.exec_id, marker) == []


async def test_timeout_sends_sigterm_first() -> None:
    # A grace far beyond the bound: a run that was not stopped by SIGTERM fails the bound.
    async with ProcessBackend(policy=confined_open(), kill_grace_s=10 * BOUND_S) as backend:
        rig = confined_rig(backend)
        async with asyncio.timeout(BOUND_S):
            result = await rig.run(
                "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
                timeout_ms=500,
            )
    assert result.reason == "timeout" and result.stdout == b"ready\nbye\n"


async def test_sigkill_after_the_grace_period() -> None:
    async with ProcessBackend(policy=confined_open(), kill_grace_s=0.3) as backend:
        rig = confined_rig(backend)
        async with asyncio.timeout(BOUND_S):  # SIGTERM is ignored: only the SIGKILL ends it
            result = await rig.run("trap '' TERM; while :; do :; done", timeout_ms=300)
    assert result.reason == "timeout" and result.duration_ms >= 600  # timeout + grace


async def test_missing_program_exits_127(process_rig: Rig) -> None:
    result = await process_rig.run("", argv=("no-such-program-here",))
    assert (result.status, result.exit_code) == ("failed", 127)
    assert b"not found" in result.stderr


async def test_environment_is_minimal(process_rig: Rig, tmp_path: Path) -> None:
    result = await process_rig.run("env", workdir=tmp_path, policy=process_rig.workspace_policy())
    names = {line.split(b"=", 1)[0] for line in result.stdout.splitlines()}
    assert names <= {b"PATH", b"HOME", b"LANG", b"PWD", b"SHLVL", b"_", b"OLDPWD"}
    assert b"HOME=/workspace\n" in result.stdout


async def test_private_workspace_without_workdir(process_rig: Rig) -> None:
    result = await process_rig.run("pwd; echo x > file && cat file")
    assert result.status == "completed" and result.stdout == b"/workspace\nx\n"


async def test_read_instance_binds_the_workspace_read_only(tmp_path: Path) -> None:
    # The instance's access wins over a policy that asks for read-write.
    rw = FilesystemPolicy.workspace_read_write()
    async with ProcessBackend(access="read", policy=SandboxPolicy(filesystem=rw)) as backend:
        rig = confined_rig(backend)
        result = await rig.run("echo x > planted", workdir=tmp_path)
    assert result.status == "failed" and b"Read-only file system" in result.stderr
    assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []


async def test_paths_mode_shows_only_the_listed_paths(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a\n")
    (tmp_path / "secret.txt").write_text("hidden\n")
    async with ProcessBackend(policy=confined_open()) as backend:
        rig = confined_rig(backend)
        fs = FilesystemPolicy.paths(read_only=["src"], read_write=["out"])
        result = await rig.run(
            "cat src/a.txt; ls; echo o > out/o.txt; echo s > src/s.txt",
            workdir=tmp_path,
            policy=rig.with_filesystem(fs),
        )
    assert result.stdout == b"a\nout\nsrc\n"  # no secret.txt
    assert b"Read-only file system" in result.stderr
    assert (tmp_path / "out" / "o.txt").read_text() == "o\n"
    assert not (tmp_path / "src" / "s.txt").exists()


async def test_memory_limit_is_a_memory_limit_result(process_rig: Rig) -> None:
    policy = process_rig.policy(memory_bytes=64 * 1024 * 1024)
    result = await process_rig.run(
        "x = bytearray(512 * 1024 * 1024)", language=PYTHON, policy=policy
    )
    assert result.status == "failed" and result.exit_code != 0
    if process_rig.backend.capabilities.enforces_memory and CgroupHost.probe() is not None:
        assert result.reason == "memoryLimit"  # the cgroup's OOM kill, reported as such
    else:
        assert b"MemoryError" in result.stderr  # RLIMIT_AS: the allocation fails


async def test_unenforced_limits_are_refused() -> None:
    # A host without cgroups: pids and cpu cannot be enforced there.
    async with ProcessBackend(policy=confined_open(), cgroups=False) as backend:
        assert not backend.capabilities.enforces_pids
        assert not backend.capabilities.enforces_cpu
        rig = confined_rig(backend)
        with pytest.raises(UnsupportedPolicy) as excinfo:
            await rig.run("true", policy=rig.policy(pids=10))
        assert excinfo.value.details["control"] == "pids"
        with pytest.raises(UnsupportedPolicy):
            await rig.run("true", policy=rig.policy(cpus=0.5))
        # Memory falls back to RLIMIT_AS, still bounded.
        result = await rig.run(
            "x = bytearray(512 * 1024 * 1024)",
            language=PYTHON,
            policy=rig.policy(memory_bytes=64 * 1024 * 1024),
        )
        assert result.status == "failed" and b"MemoryError" in result.stderr


async def test_run_cgroup_is_removed(process_rig: Rig) -> None:
    host = await asyncio.to_thread(CgroupHost.probe)
    if host is None:
        pytest.skip("no cgroups here")
    result = await process_rig.run("cat /proc/self/cgroup")
    assert result.status == "completed"

    def run_groups() -> list[str]:
        found = []
        for parent in {path.parent for path in host._dirs.values()}:
            hub = parent / f"{HUB_PREFIX}{os.getpid()}"
            if hub.is_dir():
                found += [p.name for p in hub.iterdir() if p.is_dir()]
        return found

    for _ in range(500):
        if not await asyncio.to_thread(run_groups):
            break
        await asyncio.sleep(0.01)
    assert await asyncio.to_thread(run_groups) == []


async def test_sweep_removes_groups_of_dead_hubs() -> None:
    host = await asyncio.to_thread(CgroupHost.probe)
    if host is None:
        pytest.skip("no cgroups here")
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()  # a pid that is gone: a "hub" that was SIGKILLed
    dead = await asyncio.to_thread(CgroupHost.probe, proc.pid)
    assert dead is not None
    group = await asyncio.to_thread(dead.create, RunLimits())
    assert all(path.is_dir() for path in group.dirs)
    assert await asyncio.to_thread(host.sweep) >= 1
    assert not any(path.exists() for path in group.dirs)
    assert not any(path.parent.exists() for path in group.dirs)


async def test_confined_refuses_the_host_filesystem() -> None:
    with pytest.raises(ValueError, match="confine=False"):
        ProcessBackend(policy=host_local())


async def test_missing_bwrap_is_unavailable_not_unconfined() -> None:
    async with ProcessBackend(bwrap="/nonexistent/bwrap") as backend:
        ok, why = backend.available()
        assert not ok and "bwrap" in why
        with pytest.raises(BackendUnavailable):
            await confined_rig(backend).run("true")


async def test_bwrap_that_cannot_confine_is_unavailable() -> None:
    async with ProcessBackend(bwrap="/bin/false") as backend:
        ok, why = backend.available()
        assert not ok and "cannot create namespaces" in why


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
    async with ProcessBackend(policy=confined_open()) as backend:
        rig = Rig("process", backend, backend.default_policy)
        language, source = rig.connect_program(listener.port)
        result = await rig.run(source, language=language)
    assert result.status == "completed", result.stderr
    assert await listener.settled() == 1


async def test_network_namespace_error_is_visible(process_rig: Rig, listener: Listener) -> None:
    language, source = process_rig.connect_program(listener.port)
    result = await process_rig.run(source, language=language)
    assert b"Connection refused" in result.stderr or b"unreachable" in result.stderr
    assert await listener.settled() == 0


async def test_aclose_stops_running_executions() -> None:
    backend = ProcessBackend(policy=confined_open())
    rig = confined_rig(backend)
    marker = f"aclose-{uuid.uuid4().hex}"
    request = rig.request(f"echo up; exec sh -c 'sleep 30' {marker}")
    events = backend.execute(request, None)
    await anext(events)
    await asyncio.wait_for(backend.aclose(), 5)
    rest = [event async for event in events]
    assert rest[-1].status == "cancelled"  # type: ignore[union-attr]
    assert await rig.leftovers(request.exec_id, marker) == []


# -- the unconfined instance (confine=False: trusted code only) ------------------------------


async def test_unconfined_runs_in_the_host_view(tmp_path: Path) -> None:
    async with ProcessBackend(confine=False, policy=host_local()) as backend:
        assert backend.capabilities.isolation == ExecutionIsolation.HOST_LOCAL
        rig = Rig("process", backend, host_local())
        result = await rig.run("pwd; echo $HOME", workdir=tmp_path)
    assert result.stdout == f"{tmp_path}\n{tmp_path}\n".encode()


async def test_unconfined_scratch_directory_without_workdir() -> None:
    async with ProcessBackend(confine=False, policy=host_local()) as backend:
        rig = Rig("process", backend, host_local())
        result = await rig.run("pwd; echo x > file")
    scratch = Path(result.stdout.decode().strip())
    assert result.status == "completed" and scratch.name.startswith("agora-exec-")
    assert not await asyncio.to_thread(scratch.exists)


async def test_unconfined_missing_program_exits_127() -> None:
    async with ProcessBackend(confine=False, policy=host_local()) as backend:
        rig = Rig("process", backend, host_local())
        result = await rig.run("", argv=("no-such-program-here",))
    assert (result.status, result.exit_code) == ("failed", 127)
    assert b"not found" in result.stderr


async def test_without_network_isolation_disabled_network_is_refused() -> None:
    async with ProcessBackend(confine=False, network_isolation=False) as backend:
        assert backend.capabilities.enforces_network is False
        assert backend.default_policy.network == "disabled"
        rig = Rig("process", backend, backend.default_policy)
        with pytest.raises(UnsupportedPolicy) as excinfo:
            await rig.run("true")
        assert excinfo.value.details["control"] == "network"
        # Opting in to the network works.
        result = await rig.run("true", policy=host_local())
        assert result.status == "completed"


async def test_the_probe_finds_unshare_here_and_keeps_no_state() -> None:
    first = await probe_network_isolation()
    # The namespaces bwrap needs (CI requires them): unshare makes one too.
    require("bwrap", bool(first), "unshare cannot make a network namespace here")
    assert first[-1:] == ("--",) and first[0].endswith("unshare")
    assert await probe_network_isolation() == first  # found anew, the same


# -- the instances a hub configures ------------------------------------------------------------


async def test_a_fresh_hub_runs_process_confined() -> None:
    from hub.runtime.registry import build_instance, default_configs

    [config] = [c for c in default_configs() if c.kind == "process"]
    instance = build_instance(config)
    backend = instance.backend
    await backend.start()
    try:
        assert backend.capabilities.isolation == ExecutionIsolation.NAMESPACE
        assert backend.default_policy.filesystem == FilesystemPolicy.workspace_read_write()
        assert backend.default_policy.network == "disabled"
    finally:
        await backend.aclose()


def test_unconfined_only_when_configured_by_name() -> None:
    from hub.config import BackendConfig
    from hub.runtime.registry import build_instance

    read = build_instance(BackendConfig(id="ro", kind="process", access="read"))
    assert read.backend.default_policy.filesystem == FilesystemPolicy.workspace_read_only()
    assert read.capabilities.isolation == ExecutionIsolation.NAMESPACE
    host = build_instance(
        BackendConfig(id="host", kind="process", access="read-write", limits={"confine": False})
    )
    assert host.capabilities.isolation == ExecutionIsolation.HOST_LOCAL
    assert host.backend.default_policy.filesystem.mode == "host"
