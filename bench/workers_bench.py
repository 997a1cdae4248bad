"""``agora serve --workers 2`` against one worker: ingest on disjoint workspaces, same run.

    python bench/workers_bench.py [--repeats 3] [--seconds 5] [--workers 2] [--window 8]

Two hubs are started side by side (each its own data directory on the real disk, durable
appends): ``--workers 1`` (today's single process) and ``--workers N``. Each repeat measures
both, back to back, in alternating order: 64 publishers (the hand-rolled clients of
``hub_bench.py``), each on a workspace of its own, each keeping ``--window`` single-event
publishes in flight; acknowledged events per second over ``--seconds``. Two placements on the
N-worker hub:

- ``as landed``: every publisher keeps the connection the kernel gave it, so about (N-1)/N of
  them reach a worker that does not own their workspace and are relayed to the owner;
- ``on owner``: each publisher reconnects until its connection is on its workspace's owner
  (the welcome's ``server`` names the worker), as a client that knows the layout could.

With ``--ceiling``, two more: N independent ``agora serve`` processes (no workers, no relay)
on N separate files, and on one shared file: what N processes can give on this machine, and
what sharing one SQLite file costs them.

Medians of ``--repeats``; the ratio against one worker is printed beside the issue's target
(1.7x). The load generator (this process) shares the machine's cores with the hubs, so the
CPU each used per acknowledged event is printed too: the hub's processes (supervisor and
workers, every thread) and the generator, µs per event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_bench import (
    BANNER,
    ROOT,
    SECRET,
    Peer,
    Target,
    _wait_banner,
    publish_closed_loop,
    publish_frame,
    settle,
    thread_cpu,
)

PUBLISHERS = 64
TARGET = 1.7
WORKER_PID = re.compile(r"worker (\d+) started pid=(\d+)")


def start(workers: int, data: Path | None = None) -> Target:
    """``agora serve --workers N`` on a fresh data directory (or on ``data``)."""
    from hub.auth import TokenSigner

    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    workdir = Path(tempfile.mkdtemp(prefix=f"agora-workers{workers}-", dir=base))
    log = workdir / "hub.log"
    (workdir / "agora.toml").write_text(
        "[limits]\npublish_rate = 1000000.0\npublish_burst = 1000000\n"
        "max_connections_per_agent = 1024\n"
    )
    argv = [sys.executable, "-m", "hub", "serve", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--no-a2a", "--no-http", "--data", str(data or workdir / "data")]
    argv += ["--config", str(workdir / "agora.toml"), "--workers", str(workers)]
    env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(ROOT))
    env.pop("PYTHONASYNCIODEBUG", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    port = _wait_banner(proc, log, BANNER)
    token = TokenSigner(SECRET.encode()).issue(
        "bench", ["*"], ["read", "write"], ttl_seconds=24 * 3600
    )
    return Target(f"workers{workers}", port, proc, token, workdir)


def _scratch(prefix: str) -> Path:
    """A fresh directory on the real disk (appends are durable, as in production)."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def hub_pids(target: Target) -> list[int]:
    """The supervisor (or the single process) and every worker it started, still running."""
    assert target.workdir is not None
    text = (target.workdir / "hub.log").read_text(errors="replace")
    latest: dict[int, int] = {}
    for match in WORKER_PID.finditer(text):
        latest[int(match[1])] = int(match[2])
    return [target.proc.pid, *latest.values()]


def cpu_of(pids: list[int]) -> float:
    return sum(sum(thread_cpu(pid).values()) for pid in pids)


async def open_on_owner(target: Target, workspace: str, workers: int) -> Peer:
    """A publisher whose connection is on ``workspace``'s owner (reconnecting until it is)."""
    from hub.core.sharding import owner_of  # (hub_bench put the repository first on the path)

    want = f"worker/{owner_of(workspace, workers)}".encode()
    for _ in range(200):
        peer = await Peer.open(target)
        if workers == 1 or want + b'"' in peer.welcome:
            return peer
        peer.close()
    raise RuntimeError(f"no connection reached the owner of {workspace}")


async def ingest(
    targets: list[Target], workers: int, seconds: float, window: int, *, on_owner: bool
) -> tuple[float, float, float]:
    """(acked events/s, hub CPU µs per event, generator CPU µs per event); the publishers
    are spread over ``targets`` (several: independent hubs, the ``--ceiling`` runs)."""
    spread = [targets[i % len(targets)] for i in range(PUBLISHERS)]
    workspaces = [t.workspace() for t in spread]
    if on_owner:
        peers = [
            await open_on_owner(t, w, workers) for t, w in zip(spread, workspaces, strict=True)
        ]
    else:
        peers = list(await asyncio.gather(*(Peer.open(t) for t in spread)))
    acked = [0]
    stop = False

    def run(peer: Peer, workspace: str) -> Awaitable[None]:
        data = publish_frame(workspace, 0)
        return publish_closed_loop(peer, data, window, acked, lambda: stop)

    tasks = [asyncio.create_task(run(p, w)) for p, w in zip(peers, workspaces, strict=True)]
    try:
        await asyncio.sleep(min(1.0, seconds / 3))  # warm up (and the first memberJoined…)
        pids = [pid for target in targets for pid in hub_pids(target)]
        hub_before, me_before = cpu_of(pids), sum(thread_cpu(os.getpid()).values())
        before, started = acked[0], time.perf_counter()
        await asyncio.sleep(seconds)
        count, elapsed = acked[0] - before, time.perf_counter() - started
        hub_cpu = cpu_of(pids) - hub_before
        me_cpu = sum(thread_cpu(os.getpid()).values()) - me_before
        stop = True
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        for t in tasks:
            t.cancel()
        for peer in peers:
            peer.close()
    per = 1e6 / max(1, count)
    return count / elapsed, hub_cpu * per, me_cpu * per


def stop(target: Target) -> None:
    target.proc.send_signal(signal.SIGTERM)
    try:
        target.proc.wait(60)
    except subprocess.TimeoutExpired:
        target.proc.kill()
    target.stop()


async def drive(args: argparse.Namespace) -> None:
    one, many = start(1), start(args.workers)
    hubs = [one, many]
    n = args.workers
    runs: list[tuple[str, list[Target], int, bool]] = [
        ("1 worker", [one], 1, False),
        (f"{n} workers, as landed", [many], n, False),
        (f"{n} workers, on owner", [many], n, True),
    ]
    if args.ceiling:
        # What N processes give with nothing shared but the machine (N files), and with one
        # shared file: independent `agora serve`s, each publisher on one of them.
        separate = [start(1) for _ in range(n)]
        shared_dir = _scratch("agora-shared-")
        shared = [start(1, shared_dir / "data") for _ in range(n)]
        hubs += separate + shared
        runs.append((f"{n} processes, {n} files", separate, 1, False))
        runs.append((f"{n} processes, 1 file", shared, 1, False))
    try:
        for target in hubs:
            for pid in hub_pids(target):
                await settle(pid)
        results: dict[str, list[tuple[float, float, float]]] = {}
        for repeat in range(args.repeats):
            order = runs if repeat % 2 == 0 else runs[::-1]
            for name, targets, workers, on_owner in order:
                result = await ingest(
                    targets, workers, args.seconds, args.window, on_owner=on_owner
                )
                results.setdefault(name, []).append(result)
                print(
                    f"  repeat {repeat + 1} {name}: {result[0]:,.0f} events/s "
                    f"(hub {result[1]:.0f} µs/event, generator {result[2]:.0f} µs/event)",
                    flush=True,
                )
        base = statistics.median(r[0] for r in results["1 worker"])
        print(
            f"\n64 publishers, disjoint workspaces, window {args.window}, medians of "
            f"{args.repeats} ({os.cpu_count()} cores, load generator on the same cores)"
        )
        for name, rows in results.items():
            rate = statistics.median(r[0] for r in rows)
            hub_us = statistics.median(r[1] for r in rows)
            gen_us = statistics.median(r[2] for r in rows)
            print(
                f"  {name:<24} {rate:>9,.0f} events/s  {rate / base:4.2f}x  "
                f"hub CPU {hub_us:5.0f} µs/event  generator CPU {gen_us:5.0f} µs/event"
            )
        print(f"  target: >= {TARGET}x one worker")
    finally:
        for target in hubs:
            stop(target)
        if args.ceiling:
            shutil.rmtree(shared_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=int, default=8, help="publishes in flight per publisher")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also N independent hubs on N files and on one shared file (what is possible)",
    )
    args = parser.parse_args()
    started = time.monotonic()
    asyncio.run(drive(args))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
