"""Execution latency of the ``process`` and ``container`` backends beside their floors.

    python bench/exec_bench.py [--runs N] [--no-container]

Every row is the request→result wall time of a trivial command (``true``), measured from the
caller: median and p90 over N runs (default 15, at least 5) after one warm-up run. Backend rows
drain ``execute`` to its result (``collect``): validation, spawn, pipes/attach, reaping or
container removal included.

Floors (what the backend is compared with):

* ``floor  subprocess true`` — ``subprocess.run(["true"])``: one fork/exec and wait.
* ``floor  subprocess unshare --net true`` — the same in a new network namespace (what the
  unconfined process instance adds when the network is disabled).
* ``floor  subprocess bwrap true`` — ``true`` under the exact ``bwrap`` command line the
  confined process backend builds (:func:`backends.confine.bwrap_argv`: user, PID, IPC, UTS,
  mount and network namespaces, the read-only host view), without the launcher or the cgroup.
* ``floor  docker run --rm`` — the Docker CLI running ``true`` in ``agora/busybox:1`` with
  ``--network none`` (create, attach, start, wait, remove — plus the CLI's own start-up).

Backend rows:

* ``process  confined …`` — the default, confined instance (bubblewrap, cgroup limits,
  rlimits): ``argv=["true"]``, network off (the default), network on, and network off with a
  workspace directory bound read-write.
* ``process  unconfined …`` — ``confine=False`` (trusted code only), host_local policy, network
  on, then off (``unshare --net``).
* ``container  cold`` — a fresh container per run (``warm_pool=0``): create, attach, start,
  wait, remove.
* ``container  warm`` — a container from the warm pool (started ahead, idle); the pool is
  refilled *between* runs, outside the timing, which is the steady state at a modest request
  rate. At a higher rate than the pool refills, runs fall back to the cold path.
* ``container  workspace rw`` — cold, with a workspace directory bind-mounted read-write (the
  runtime's usual case: warm containers cannot take a mount).

``ratio`` is median / the row's floor median.

``--hub`` adds the same runs THROUGH THE HUB (a real ``agora serve`` over a WebSocket, from
``exec`` to its ``execFinished`` event): ``hub  process  network on|off``, ``hub  container
warm|workspace rw``, beside these floors (bench/runtime_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.base import (
    CodeExecutor,
    ExecutionRequest,
    FilesystemPolicy,
    PolicyPatch,
    SandboxPolicy,
    Source,
    collect,
    host_local,
    narrow,
)
from backends.confine import Sandbox, bwrap_argv, host_view, stage_host_etc
from backends.container import ContainerBackend, engine_reachable
from backends.container.images import DEFAULT_IMAGE
from backends.process import ProcessBackend

Row = tuple[str, list[float], str]


def sync_times(run: Callable[[], object], runs: int) -> list[float]:
    run()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


async def async_times(
    run: Callable[[], Awaitable[object]],
    runs: int,
    before: Callable[[], Awaitable[object]] | None = None,
) -> list[float]:
    await run()
    times = []
    for _ in range(runs):
        if before is not None:
            await before()
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return times


def runner(
    backend: CodeExecutor, policy: SandboxPolicy, workdir: Path | None = None
) -> Callable[[], Awaitable[object]]:
    async def run() -> None:
        request = ExecutionRequest(
            exec_id=f"bench-{uuid.uuid4().hex[:12]}",
            payload=Source(""),
            argv=("true",),
            policy=policy,
        )
        result = await collect(backend.execute(request, workdir))
        assert result.status == "completed", result

    return run


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def p90_ms(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000


async def process_rows(runs: int) -> list[Row]:
    rows: list[Row] = [
        ("floor  subprocess true", sync_times(lambda: subprocess.run(["true"]), runs), ""),
    ]
    unshare = shutil.which("unshare") or "unshare"
    rows.append(
        (
            "floor  subprocess unshare --net true",
            sync_times(lambda: subprocess.run([unshare, "--net", "--", "true"]), runs),
            "",
        )
    )
    open_policy = SandboxPolicy(
        network="enabled", filesystem=FilesystemPolicy.workspace_read_write()
    )
    async with ProcessBackend(policy=open_policy) as confined:
        ok, why = confined.available()
        if not ok:
            print(f"(confined process rows skipped: {why})", file=sys.stderr)
        else:
            staging = Path(tempfile.mkdtemp(prefix="agora-bench-etc-"))
            bwrap = bwrap_argv(
                shutil.which("bwrap") or "bwrap",
                host_view(staged=stage_host_etc(staging)),
                Sandbox(mounts=()),
                ["true"],
            )
            rows.append(
                (
                    "floor  subprocess bwrap true",
                    sync_times(lambda: subprocess.run(bwrap, check=True), runs),
                    "",
                )
            )
            shutil.rmtree(staging, ignore_errors=True)
            off = narrow(open_policy, PolicyPatch(network="disabled"))
            rows.append(
                (
                    "process  confined network off",
                    await async_times(runner(confined, off), runs),
                    "floor  subprocess bwrap true",
                )
            )
            rows.append(
                (
                    "process  confined network on",
                    await async_times(runner(confined, open_policy), runs),
                    "floor  subprocess bwrap true",
                )
            )
            with tempfile.TemporaryDirectory(prefix="agora-bench-") as tmp:
                rows.append(
                    (
                        "process  confined workspace rw",
                        await async_times(runner(confined, off, Path(tmp)), runs),
                        "floor  subprocess bwrap true",
                    )
                )
    async with ProcessBackend(confine=False, policy=host_local()) as backend:
        on = host_local()
        rows.append(
            (
                "process  unconfined network on",
                await async_times(runner(backend, on), runs),
                "floor  subprocess true",
            )
        )
        if backend.capabilities.enforces_network:
            off = narrow(on, PolicyPatch(network="disabled"))
            rows.append(
                (
                    "process  unconfined network off",
                    await async_times(runner(backend, off), runs),
                    "floor  subprocess unshare --net true",
                )
            )
    return rows


async def container_rows(runs: int) -> list[Row]:
    ok, why = engine_reachable()
    if not ok:
        print(f"(container rows skipped: {why})", file=sys.stderr)
        return []
    owner = f"agora-bench-{uuid.uuid4().hex[:6]}"
    rows: list[Row] = []
    async with ContainerBackend(owner=owner, warm_pool=0) as cold:
        ok, why = cold.available()
        if not ok:
            print(f"(container rows skipped: {why})", file=sys.stderr)
            return []
        docker = shutil.which("docker") or "docker"
        cli = [docker, "run", "--rm", "--network", "none", DEFAULT_IMAGE, "true"]
        rows.append(
            (
                "floor  docker run --rm",
                sync_times(lambda: subprocess.run(cli, check=True), runs),
                "",
            )
        )
        no_fs = narrow(cold.default_policy, PolicyPatch(filesystem=FilesystemPolicy.none()))
        rows.append(
            (
                "container  cold",
                await async_times(runner(cold, no_fs), runs),
                "floor  docker run --rm",
            )
        )
        with tempfile.TemporaryDirectory(prefix="agora-bench-") as tmp:
            (Path(tmp) / "input.txt").write_text("workspace file\n")
            rows.append(
                (
                    "container  workspace rw",
                    await async_times(runner(cold, cold.default_policy, Path(tmp)), runs),
                    "floor  docker run --rm",
                )
            )
    async with ContainerBackend(owner=owner, warm_pool=2) as warm:

        async def refill() -> None:
            await warm.wait_warm(60)

        rows.append(
            (
                "container  warm",
                await async_times(runner(warm, no_fs), runs, before=refill),
                "floor  docker run --rm",
            )
        )
    return rows


def print_table(rows: list[Row]) -> None:
    medians = {name: median_ms(times) for name, times, _ in rows}
    header = f"{'row':<40} {'median ms':>10} {'p90 ms':>9} {'runs':>5}  {'ratio to floor':<30}"
    print(header)
    print("-" * len(header))
    for name, times, floor in rows:
        ratio = f"{medians[name] / medians[floor]:.2f}x {floor.split('  ')[1]}" if floor else ""
        print(f"{name:<40} {medians[name]:>10.2f} {p90_ms(times):>9.2f} {len(times):>5}  {ratio}")


async def run(args: argparse.Namespace) -> list[Row]:
    rows = await process_rows(args.runs)
    if not args.no_container:
        rows += await container_rows(args.runs)
    if args.hub:
        from runtime_bench import hub_rows  # bench/runtime_bench.py

        container = not args.no_container and engine_reachable()[0]
        rows += await hub_rows(args.runs, container)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per row (min 5)")
    parser.add_argument("--no-container", action="store_true", help="skip the Docker rows")
    parser.add_argument("--hub", action="store_true", help="add the rows through the hub")
    args = parser.parse_args(argv)
    args.runs = max(5, args.runs)
    print_table(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
