"""Execution latency THROUGH THE HUB, beside the floors of bench/exec_bench.py.

    python bench/runtime_bench.py [--runs N] [--no-container]

A real ``agora serve`` subprocess (SQLite, ``synchronous=FULL``) and one raw WebSocket client
(subscribed to the workspace). Every row is the wall time from sending ``exec`` to receiving
that execution's ``execFinished`` event over the socket: median and p90 over N runs (default
15, at least 5) after one warm-up run. It includes everything the runtime does: the ``exec``
checks, ``execRequested`` committed before ``execAccepted``, the workspace push (an empty
workspace here) and pull, ``execStarted``, the run, ``execFinished`` committed and fanned out.

Rows (the program is ``argv: ["true"]``, no shell):

* ``hub  process  network on`` — an instance configured with ``network = "enabled"``; compared
  with ``floor  subprocess true``.
* ``hub  process  network off`` — the default instance (network off: ``unshare --net``);
  compared with ``floor  subprocess unshare --net true``.
* ``hub  container  warm`` — filesystem ``none`` so a warm-pool container can take it; 0.5 s
  between runs so the pool refills (steady state at a modest rate); compared with
  ``floor  docker run --rm``.
* ``hub  container  workspace rw`` — the workspace bind-mounted (a cold container per run:
  warm containers cannot take a mount); compared with ``floor  docker run --rm``.

The floors are measured here the same way bench/exec_bench.py does (``exec_bench.py --hub``
prints these rows beside its backend rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from websockets.asyncio.client import ClientConnection, connect  # noqa: E402

from hub.auth import TokenSigner  # noqa: E402

Row = tuple[str, list[float], str]
SECRET = "agora-bench-secret-0123456789-abcdefghijklmnop"
CONFIG = """
[[backends]]
id = "process"
kind = "process"
access = "read-write"

[[backends]]
id = "process-net"
kind = "process"
access = "read-write"
limits = { network = "enabled" }

[[backends]]
id = "container"
kind = "container"
access = "read-write"
"""


class Hub:
    """An ``agora serve`` subprocess on a free port with a temporary data directory."""

    def __init__(self, root: Path) -> None:
        (root / "agora.toml").write_text(CONFIG)
        argv = [sys.executable, "-m", "hub", "serve", "--port", "0", "--no-a2a", "--no-http"]
        argv += ["--data", str(root / "data"), "--config", str(root / "agora.toml")]
        env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(REPO))
        env.pop("PYTHONASYNCIODEBUG", None)
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + 30
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                raise RuntimeError("agora serve did not start")
            line += os.read(self.proc.stdout.fileno(), 1024)
        self.url = line.decode().split()[2]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


class Client:
    """One raw connection, subscribed to the bench workspace."""

    def __init__(self, ws: ClientConnection, workspace: str) -> None:
        self.ws = ws
        self.workspace = workspace
        self.rid = 0

    @classmethod
    async def open(cls, url: str, workspace: str) -> Client:
        token = TokenSigner(SECRET.encode()).issue(
            "bench", ["*"], ["read", "write", "exec"], backends=["*"], ttl_seconds=3600
        )
        ws = await connect(url, compression=None, max_size=None)
        client = cls(ws, workspace)
        await ws.send(json.dumps({"op": "hello", "token": token}))
        assert json.loads(await ws.recv())["op"] == "welcome"
        await ws.send(json.dumps({"op": "subscribe", "workspace": workspace, "rid": "sub"}))
        assert json.loads(await ws.recv())["op"] == "subscribed"
        return client

    async def run(self, **fields: Any) -> None:
        """``exec`` and wait for its ``execFinished`` event (asserting it completed)."""
        exec_id = uuid.uuid4().hex
        self.rid += 1
        frame = {"op": "exec", "rid": self.rid, "workspace": self.workspace, "execId": exec_id}
        await self.ws.send(json.dumps({**frame, **fields}))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("op") == "error":
                raise RuntimeError(f"exec refused: {reply}")
            if reply.get("op") != "event":
                continue
            event = reply["event"]
            if event["kind"] == "execFinished" and event["payload"]["execId"] == exec_id:
                if event["payload"]["status"] != "completed":
                    raise RuntimeError(f"run failed: {event}")
                return


def sync_times(run: Callable[[], object], runs: int) -> list[float]:
    run()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


async def async_times(
    run: Callable[[], Awaitable[object]], runs: int, pause: float = 0.0
) -> list[float]:
    await run()
    times = []
    for _ in range(runs):
        if pause:
            await asyncio.sleep(pause)
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return times


def floors(runs: int, container: bool) -> list[Row]:
    rows: list[Row] = [
        ("floor  subprocess true", sync_times(lambda: subprocess.run(["true"]), runs), "")
    ]
    unshare = shutil.which("unshare") or "unshare"
    rows.append(
        (
            "floor  subprocess unshare --net true",
            sync_times(lambda: subprocess.run([unshare, "--net", "--", "true"]), runs),
            "",
        )
    )
    if container:
        cli = [shutil.which("docker") or "docker", "run", "--rm", "--network", "none"]
        cli += ["agora/busybox:1", "true"]
        rows.append(
            (
                "floor  docker run --rm",
                sync_times(lambda: subprocess.run(cli, check=True), runs),
                "",
            )
        )
    return rows


async def hub_rows(runs: int, container: bool) -> list[Row]:
    """The through-the-hub rows (the floors they compare with are not included)."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="agora-runtime-bench-") as tmp:
        hub = Hub(Path(tmp))
        try:
            client = await Client.open(hub.url, "bench")
            argv = {"argv": ["true"]}
            rows.append(
                (
                    "hub  process  network on",
                    await async_times(lambda: client.run(backend="process-net", **argv), runs),
                    "floor  subprocess bwrap true",
                )
            )
            rows.append(
                (
                    "hub  process  network off",
                    await async_times(lambda: client.run(backend="process", **argv), runs),
                    "floor  subprocess bwrap true",  # the default instance is confined
                )
            )
            if container:
                none = {"policy": {"filesystem": {"mode": "none"}}}
                rows.append(
                    (
                        "hub  container  warm",
                        await async_times(
                            lambda: client.run(backend="container", **argv, **none), runs, 0.5
                        ),
                        "floor  docker run --rm",
                    )
                )
                rows.append(
                    (
                        "hub  container  workspace rw",
                        await async_times(lambda: client.run(backend="container", **argv), runs),
                        "floor  docker run --rm",
                    )
                )
            await client.ws.close()
        finally:
            hub.stop()
    return rows


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def p90_ms(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000


def print_table(rows: list[Row]) -> None:
    medians = {name: median_ms(times) for name, times, _ in rows}
    header = f"{'row':<40} {'median ms':>10} {'p90 ms':>9} {'runs':>5}  {'ratio to floor':<30}"
    print(header)
    print("-" * len(header))
    for name, times, floor in rows:
        ratio = ""
        if floor in medians:
            ratio = f"{medians[name] / medians[floor]:.2f}x {floor.split('  ')[1]}"
        print(f"{name:<40} {medians[name]:>10.2f} {p90_ms(times):>9.2f} {len(times):>5}  {ratio}")


def docker_ok() -> bool:
    from backends.container import engine_reachable

    ok, why = engine_reachable()
    if not ok:
        print(f"(container rows skipped: {why})", file=sys.stderr)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per row (min 5)")
    parser.add_argument("--no-container", action="store_true", help="skip the Docker rows")
    args = parser.parse_args(argv)
    runs = max(5, args.runs)
    container = not args.no_container and docker_ok()
    rows = floors(runs, container) + asyncio.run(hub_rows(runs, container))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
