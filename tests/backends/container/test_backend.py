"""What only the ``container`` backend does (backends/container/); the shared behaviour is in
test_conformance.py. Tests that need the engine take ``container_rig`` (which requires docker)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import uuid
from pathlib import Path
from typing import Final

import pytest

from backends.base import (
    BackendUnavailable,
    FilesystemPolicy,
    InvalidRequest,
    PolicyPatch,
    narrow,
    strict,
)
from backends.container import (
    DEFAULT_CONTAINER_POLICY,
    DEFAULT_IMAGE,
    LAUNCHER,
    ContainerBackend,
    container_config,
    warm_prelude,
)
from tests.backends.helpers import BOUND_S
from tests.backends.rigs import Listener, Rig
from tests.support.docker import (
    TEST_OWNER,
    EngineProxy,
    docker_available,
    owned_containers,
    remove_owned,
)
from tests.support.require import require

MIB = 1024 * 1024


# -- without an engine ------------------------------------------------------------------------


async def test_unreachable_engine_is_unavailable(tmp_path: Path) -> None:
    backend = ContainerBackend(base_url=f"unix://{tmp_path}/no-docker.sock", engine_timeout_s=2)
    async with backend:
        ok, why = backend.available()
        assert not ok and "not reachable" in why
        rig = Rig("container", backend, narrow(backend.default_policy, None))
        with pytest.raises(BackendUnavailable):
            await rig.run("true")


def test_container_config_is_locked_down() -> None:
    config = container_config(
        image="agora/busybox:1",
        command=["/bin/sh", "-c", "true"],
        user="65534:65534",
        env={"PATH": "/bin", "A": "b=c"},
        working_dir="/workspace",
        labels={"agora.exec": "e1"},
        network_mode="none",
        memory_bytes=64 * MIB,
        pids=32,
        cpus=0.5,
        mounts=[],
        stdin=False,
    )
    host = config["HostConfig"]
    assert config["User"] == "65534:65534" and config["Env"] == ["PATH=/bin", "A=b=c"]
    assert config["NetworkDisabled"] is True and host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"] and host["Privileged"] is False
    assert host["Memory"] == host["MemorySwap"] == 64 * MIB
    assert host["PidsLimit"] == 32 and host["NanoCpus"] == 500_000_000
    assert "/tmp" in host["Tmpfs"] and host["LogConfig"]["Type"] == "none"
    assert config["Labels"] == {"agora.exec": "e1"}


def test_default_policy_is_strict_with_limits() -> None:
    policy = DEFAULT_CONTAINER_POLICY
    assert policy.network == "disabled" and policy.environment.mode == "none"
    assert policy.memory_bytes and policy.pids and policy.cpus


@pytest.mark.parametrize(
    "source",
    ["echo plain", 'printf \'%s|\' "$@"; echo "$WEIRD"', "echo 'it''s'; echo \"a\nb\" $((1+2))"],
)
def test_warm_prelude_round_trips_through_a_shell(source: str, tmp_path: Path) -> None:
    # The launcher and prelude are plain POSIX sh: check them with the host's shell.
    env = {"WEIRD": "quote ' dollar $HOME backtick ` newline \n end"}
    line = warm_prelude(["/bin/sh", "-c", source, "sh", "a b", "'c'"], env, str(tmp_path))
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert "exec /bin/sh -c" in base64.b64decode(line).decode()
    host = subprocess.run(
        ["/bin/sh", "-c", LAUNCHER],
        input=line + b"rest of stdin",
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )
    direct = subprocess.run(
        ["/bin/sh", "-c", source, "sh", "a b", "'c'"],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", **env},
        cwd=tmp_path,
        check=False,
    )
    assert host.returncode == direct.returncode == 0
    assert host.stdout == direct.stdout


# -- with the engine ------------------------------------------------------------------------


FORK_BOMB: Final = (
    "f() { f | f & }; (f) & i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo still here"
)
"""The bomb goes off in a subshell (one fork), and the shell then waits and echoes with builtins
only: a fork the shell itself needs once the bomb holds every pid fails, and the shell exits 2
(it did, under load, with the bomb started by the shell's own pipeline and ``sleep 1``)."""


async def test_fork_bomb_is_held_by_the_pids_limit(container_rig: Rig) -> None:
    async with asyncio.timeout(BOUND_S):
        result = await container_rig.run(FORK_BOMB, policy=container_rig.policy(pids=32))
    assert result.status == "completed" and result.stdout == b"still here\n"
    assert b"can't fork" in result.stderr or b"Resource temporarily unavailable" in result.stderr


async def test_memory_hog_is_stopped(container_rig: Rig) -> None:
    result = await container_rig.run(
        "dd if=/dev/zero of=/dev/null bs=256M count=1",
        policy=container_rig.policy(memory_bytes=64 * MIB),
    )
    assert (result.status, result.reason) == ("failed", "memoryLimit")
    assert result.exit_code == 137
    assert any(d.code == "memoryLimit" and "memory limit" in d.message for d in result.diagnostics)


async def test_sandbox_settings_inside(container_rig: Rig) -> None:
    result = await container_rig.run(
        "id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; "
        "touch /not-allowed 2>&1; touch /tmp/ok && echo tmp-ok; ls /sys/class/net"
    )
    lines = result.stdout.decode().splitlines()
    assert lines[0:2] == ["65534", "65534"]
    assert "CapEff:\t0000000000000000" in lines and "NoNewPrivs:\t1" in lines
    assert any("Read-only file system" in line for line in lines)
    assert "tmp-ok" in lines
    assert lines[-1] == "lo"  # network none: loopback only


async def test_warm_pool_serves_runs_without_a_workspace(
    container_rig: Rig, tmp_path: Path
) -> None:
    warm = container_rig.kind == "container"
    backend = container_rig.backend
    assert isinstance(backend, ContainerBackend)
    if warm:
        assert await backend.wait_warm(60)
    first = await container_rig.run("echo one")
    assert first.metadata is not None and first.metadata.warm is warm
    second = await container_rig.run("echo two")
    assert second.stdout == b"two\n"
    with_workspace = await container_rig.run(
        "echo three", workdir=tmp_path, policy=container_rig.workspace_policy()
    )
    assert with_workspace.metadata is not None and with_workspace.metadata.warm is False
    # A different limit than the pool's also takes a fresh container.
    other = await container_rig.run("echo four", policy=container_rig.policy(pids=64))
    assert other.metadata is not None and other.metadata.warm is False


async def test_warm_and_cold_environment_match(container_rig: Rig) -> None:
    result = await container_rig.run("env | sort; pwd; echo $0")
    names = sorted(line.split("=", 1)[0] for line in result.stdout.decode().splitlines()[:-2])
    assert names == ["HOME", "HOSTNAME", "LANG", "PATH", "PWD", "SHLVL"]
    assert result.stdout.endswith(b"/tmp\nsh\n")


async def test_path_lists(container_rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "readme").write_text("doc\n")
    (tmp_path / "secret.txt").write_text("not mounted\n")
    policy = container_rig.with_filesystem(
        FilesystemPolicy.paths(read_only=["docs"], read_write=["out"])
    )
    result = await container_rig.run(
        "cat docs/readme; cat secret.txt 2>/dev/null || echo no-secret; echo made > out/file;"
        " echo x > docs/new 2>/dev/null || echo docs-read-only",
        workdir=tmp_path,
        policy=policy,
    )
    assert result.stdout == b"doc\nno-secret\ndocs-read-only\n", result.stderr
    assert (tmp_path / "out" / "file").read_text() == "made\n"
    assert not (tmp_path / "docs" / "new").exists()


async def test_subtree_root(container_rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.txt").write_text("inner\n")
    (tmp_path / "outer.txt").write_text("outer\n")
    policy = container_rig.with_filesystem(FilesystemPolicy.workspace_read_write("sub"))
    result = await container_rig.run("ls /workspace", workdir=tmp_path, policy=policy)
    assert result.stdout == b"inner.txt\n"


async def test_symlink_out_of_the_workspace_is_refused(container_rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "escape").symlink_to("/etc")
    policy = container_rig.with_filesystem(FilesystemPolicy.workspace_read_only("escape"))
    with pytest.raises(InvalidRequest):
        await container_rig.run("ls", workdir=tmp_path, policy=policy)


async def test_cwd_needs_a_workspace(container_rig: Rig) -> None:
    with pytest.raises(InvalidRequest):
        await container_rig.run("pwd", cwd="sub")


async def test_sweep_removes_leftovers(container_rig: Rig) -> None:
    import docker

    backend = container_rig.backend
    assert isinstance(backend, ContainerBackend)
    client = docker.from_env()
    try:
        leftover = client.api.create_container(
            backend.image, command=["sleep", "60"], labels={"agora.owner": TEST_OWNER}
        )["Id"]
        other = client.api.create_container(
            backend.image, command=["true"], labels={"agora.owner": "someone-else"}
        )["Id"]
        try:
            assert await backend.sweep() >= 1
            ids = {c["Id"] for c in client.api.containers(all=True)}
            assert leftover not in ids and other in ids
        finally:
            client.api.remove_container(other, force=True)
    finally:
        client.close()


async def test_a_workers_sweep_leaves_its_siblings_containers() -> None:
    """Worker 1 of ``--workers 2`` sweeps only what carries its worker label; worker 0 its own
    and those no running worker claims (no label: a one-process hub before; index 2: a start
    with more workers); a hub of one process sweeps them all."""
    import docker

    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    owner = f"{TEST_OWNER}-workers"
    client = docker.from_env()
    made: dict[str, str] = {}
    try:
        for name, labels in {
            "w0": {"agora.worker": "0"},
            "w1": {"agora.worker": "1"},
            "w2": {"agora.worker": "2"},
            "plain": {},
        }.items():
            made[name] = client.api.create_container(
                DEFAULT_IMAGE, command=["true"], labels={"agora.owner": owner, **labels}
            )["Id"]

        async def swept(**kwargs: int | None) -> set[str]:
            before = set(owned_containers(owner))
            async with ContainerBackend(owner=owner, warm_pool=0, **kwargs) as backend:
                await backend.start()
            return {
                name for name, cid in made.items() if cid in before - set(owned_containers(owner))
            }

        assert await swept(worker=1, workers=2) == {"w1"}
        assert await swept(worker=0, workers=2) == {"w0", "w2", "plain"}
        made["again"] = client.api.create_container(
            DEFAULT_IMAGE, command=["true"], labels={"agora.owner": owner, "agora.worker": "1"}
        )["Id"]
        assert await swept(worker=None) == {"again"}
    finally:
        for cid in made.values():
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(cid, force=True)
        client.close()


async def test_network_enabled_mode_reaches_the_host(listener: Listener) -> None:
    # The positive control of the conformance network test (host networking, since this
    # engine runs without a bridge): the same nc does connect when the network is enabled.
    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    policy = strict().replace(network="enabled")
    async with ContainerBackend(
        owner=f"{TEST_OWNER}-net", policy=policy, network_enabled_mode="host", warm_pool=0
    ) as backend:
        rig = Rig("container", backend, policy)
        result = await rig.run(f"echo hello | nc -w 2 127.0.0.1 {listener.port}")
    assert result.status == "completed", result.stderr
    assert listener.accepted == 1


async def test_container_is_removed_after_a_timeout(container_rig: Rig) -> None:
    request = container_rig.request("sleep 60", timeout_ms=500)
    result = await container_rig.run_request(request)
    assert result.reason == "timeout"
    assert await container_rig.leftovers(request.exec_id) == []


async def test_no_containers_left_after_aclose() -> None:
    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    owner = f"{TEST_OWNER}-close-{uuid.uuid4().hex[:6]}"
    backend = ContainerBackend(owner=owner, warm_pool=2)
    await backend.start()
    assert await backend.wait_warm(60)
    assert len(await asyncio.to_thread(owned_containers, owner)) == 2  # the warm pool
    rig = Rig(
        "container",
        backend,
        narrow(backend.default_policy, PolicyPatch(filesystem=FilesystemPolicy.none())),
    )
    events = backend.execute(rig.request("echo up; sleep 30"), None)
    await anext(events)
    await backend.aclose()
    await events.aclose()
    assert await asyncio.to_thread(owned_containers, owner) == []


async def test_missing_image_without_auto_build_is_unavailable() -> None:
    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    async with ContainerBackend(
        owner=f"{TEST_OWNER}-img", image="agora-test/missing:1", auto_build=False, warm_pool=0
    ) as backend:
        ok, why = backend.available()
        assert not ok and "agora images build" in why
        rig = Rig("container", backend, backend.default_policy)
        with pytest.raises(BackendUnavailable):
            await rig.run("true")


async def test_a_close_during_a_warm_fill_leaves_no_container(tmp_path: Path) -> None:
    """The close comes while the warm pool's fill waits for the engine to create a container
    (held here: :class:`EngineProxy`): the close waits for the fill (a job of the registry),
    which removes the container it got once the engine answers, so nothing is left on the
    engine. (Only a stop that gives up on the engine, ``abandon``, leaves containers: to the
    next start's sweep.)"""
    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    owner = f"{TEST_OWNER}-fill-{uuid.uuid4().hex[:6]}"
    try:
        async with EngineProxy(tmp_path / "engine.sock") as engine:
            backend = ContainerBackend(owner=owner, warm_pool=1, base_url=engine.base_url)
            await backend.start()  # the fill is spawned, its create not sent yet
            engine.freeze()  # ... and held once sent
            closing = asyncio.create_task(backend.aclose())
            await asyncio.sleep(0.5)  # the close waits for the fill, whose create is held
            engine.thaw()
            await asyncio.wait_for(closing, BOUND_S)
            await asyncio.sleep(2)  # (a create the close did not wait for lands meanwhile)
        assert await asyncio.to_thread(owned_containers, owner) == []
    finally:
        await asyncio.to_thread(remove_owned, [owner])
