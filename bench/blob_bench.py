"""Blob transfer benchmark: upload and download MB/s through the hub (``putBlob``/``getBlob``,
the Python client) beside raw ``websockets`` moving the same bytes in the same run, and the
hub's RSS while several clients transfer at once.

Two server processes: ``agora serve`` (SQLite data directory on the real disk; blobs are files
there, fsynced at commit) and a raw ``websockets`` server (this file with ``--raw-server``)
that swallows binary frames (upload) or sends N bytes in binary frames of the same chunk size
(download), touching no disk. Content comes from and goes to files, so neither the driver nor
the hub holds a whole blob. Per run: ``--clients`` clients upload a file of ``--mib`` MiB each
(distinct content) at once, then each downloads every client's blob... one each, at once; the
raw server gets the same pattern. Medians of ``--repeats`` runs; RSS sampled every 20 ms
from /proc (baseline before the run, peak during it).

    nice -n 10 python3 bench/blob_bench.py --mib 200 --clients 3 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo
from hub_bench import Target, _wait_banner, start_hub

from hub.client import connect

CHUNK = 256 * 1024
RAW_BANNER = re.compile(rb"raw blob server on (\d+)")
MIB = 1024 * 1024


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """Peak RSS of ``pid`` while running (sampled every 20 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.base = pid, 0, rss_kib(pid)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_kib(self.pid))
            await asyncio.sleep(0.02)

    def __enter__(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


# -- the raw websockets server ----------------------------------------------------------


async def raw_server() -> None:
    from websockets.asyncio.server import ServerConnection, serve

    async def handle(ws: ServerConnection) -> None:
        path = ws.request.path if ws.request is not None else "/"
        if path.startswith("/up/"):
            want, got = int(path[4:]), 0
            while got < want:
                got += len(await ws.recv())
            await ws.send("done")
        else:
            size = int(path[6:])
            block = os.urandom(CHUNK)
            sent = 0
            while sent < size:
                n = min(CHUNK, size - sent)
                await ws.send(block[:n])
                sent += n

    async with serve(handle, "127.0.0.1", 0, max_size=None, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"raw blob server on {port}", flush=True)
        await asyncio.Future()


def start_raw() -> Target:
    workdir = Path(tempfile.mkdtemp(prefix="agora-bench-rawblob-"))
    log = workdir / "raw.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--raw-server"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Target("raw", _wait_banner(proc, log, RAW_BANNER), proc, workdir=workdir)


async def raw_up(port: int, path: Path) -> None:
    from websockets.asyncio.client import connect as ws_connect

    size = (await asyncio.to_thread(path.stat)).st_size
    async with ws_connect(
        f"ws://127.0.0.1:{port}/up/{size}", max_size=None, compression=None
    ) as ws:
        with path.open("rb") as f:
            while part := await asyncio.to_thread(f.read, CHUNK):
                await ws.send(part)
        await ws.recv()


async def raw_down(port: int, size: int, dest: Path) -> None:
    from websockets.asyncio.client import connect as ws_connect

    async with ws_connect(
        f"ws://127.0.0.1:{port}/down/{size}", max_size=None, compression=None
    ) as ws:
        got = 0
        with dest.open("wb") as f:
            while got < size:
                part = await ws.recv()
                assert isinstance(part, bytes)
                await asyncio.to_thread(f.write, part)
                got += len(part)


# -- one run ----------------------------------------------------------------------------


async def hub_run(hub: Target, files: list[Path], out: Path) -> tuple[float, float, int, int]:
    """(upload MB/s, download MB/s, baseline RSS KiB, peak RSS KiB) of all clients at once."""
    total = sum(f.stat().st_size for f in files)
    workspace = hub.workspace()
    sessions = [connect(f"ws://127.0.0.1:{hub.port}", hub.token) for _ in files]
    for s in sessions:
        await s.open()
    try:
        with Sampler(hub.proc.pid) as rss:
            t0 = time.perf_counter()
            written = await asyncio.gather(
                *(s.workspace(workspace).put_blob(f) for s, f in zip(sessions, files, strict=True))
            )
            up = total / (time.perf_counter() - t0) / 1e6
            # Referenced as artifacts, so that a reader of the workspace may download them.
            for i, (s, sha) in enumerate(zip(sessions, written, strict=True)):
                await s.workspace(workspace).publish(
                    {"kind": "artifactPublished", "payload": {"key": f"f{i}", "blob": sha}}
                )
            t0 = time.perf_counter()
            await asyncio.gather(
                *(
                    s.workspace(workspace).get_blob(sha, out / f"down-{i}")
                    for i, (s, sha) in enumerate(zip(sessions, written, strict=True))
                )
            )
            down = total / (time.perf_counter() - t0) / 1e6
        return up, down, rss.base, rss.peak
    finally:
        for s in sessions:
            await s.aclose()


async def raw_run(raw: Target, files: list[Path], out: Path) -> tuple[float, float]:
    total = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    await asyncio.gather(*(raw_up(raw.port, f) for f in files))
    up = total / (time.perf_counter() - t0) / 1e6
    t0 = time.perf_counter()
    await asyncio.gather(
        *(raw_down(raw.port, f.stat().st_size, out / f"raw-{i}") for i, f in enumerate(files))
    )
    down = total / (time.perf_counter() - t0) / 1e6
    return up, down


def _fill(path: Path, mib: int) -> None:
    with path.open("wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MIB))


def _refresh(files: list[Path]) -> None:
    for path in files:
        with path.open("r+b") as f:
            f.write(os.urandom(MIB))


def _cleanup(work: Path) -> None:
    for p in work.iterdir():
        p.unlink()
    work.rmdir()


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="agora-blob-bench-", dir="/var/tmp"))
    files = []
    for i in range(args.clients):
        path = work / f"in-{i}.bin"
        await asyncio.to_thread(_fill, path, args.mib)
        files.append(path)
    hub, raw = start_hub(), start_raw()
    results: dict[str, list[float]] = {k: [] for k in ("hub_up", "hub_down", "raw_up", "raw_down")}
    rss: list[tuple[int, int]] = []
    try:
        for _ in range(args.repeats):
            # Fresh content per run: a blob already stored would be "uploaded" at once.
            await asyncio.to_thread(_refresh, files)
            up, down, base, peak = await hub_run(hub, files, work)
            results["hub_up"].append(up)
            results["hub_down"].append(down)
            rss.append((base, peak))
            rup, rdown = await raw_run(raw, files, work)
            results["raw_up"].append(rup)
            results["raw_down"].append(rdown)
    finally:
        hub.stop()
        raw.stop()
        await asyncio.to_thread(_cleanup, work)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{args.clients} clients x {args.mib} MiB, {args.repeats} runs (medians)")
    print(f"upload   hub {med['hub_up']:8.1f} MB/s   raw websockets {med['raw_up']:8.1f} MB/s")
    print(f"download hub {med['hub_down']:8.1f} MB/s   raw websockets {med['raw_down']:8.1f} MB/s")
    growth = [(p - b) / 1024 for b, p in rss]
    print(
        f"hub RSS: baseline {statistics.median(b for b, _ in rss) / 1024:.1f} MiB, "
        f"peak growth during the transfers {statistics.median(growth):.1f} MiB "
        f"(max {max(growth):.1f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB per client (default 64)")
    parser.add_argument("--clients", type=int, default=3, help="clients at once (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs (default 3)")
    parser.add_argument("--raw-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_server:
        asyncio.run(raw_server())
    else:
        asyncio.run(main(args))
