"""Start time and memory of ``agora serve`` against the size of its history.

    python bench/startup_bench.py [--workspaces 10,1000] [--events 1000] [--keep DIR]

For each workspace count W, a data directory of W workspaces x ``--events`` events is built
with the store API directly (SQLite; ``messagePosted`` events, and in every workspace one
member that joined and left and one finished execution, so that a full recovery scan has
journals and presence to fold). Then ``agora serve`` is started on it twice:

* ``scan`` — the first start: the directory has no recovery index (as one written by an
  older hub), so recovery folds every workspace's log, then writes the index;
* ``indexed`` — the second start: recovery reads only what the index names.

Each row: the wall time from spawning the process to its banner (it prints the banner once
recovery is done and the socket listens), and its resident memory (``VmRSS``) and peak
(``VmHWM``) read from /proc at that moment; then, as the hub starts its execution backends in
the background after the banner (while it already serves), the seconds until it goes quiet
(a second with under 10 ms of CPU; at most 30 s) and the CPU seconds it used from launch to
then (``/proc/<pid>/stat``, user + system). The process is then stopped with SIGTERM.
Bounded: building 1,000 x 1,000 events takes a few minutes on a small machine; ``--keep`` reuses
built directories.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hub.core.events import (  # noqa: E402
    ExecFinished,
    ExecFinishedPayload,
    ExecRequested,
    ExecRequestedPayload,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePayload,
    MessagePosted,
)
from hub.log.factory import open_store  # noqa: E402

BANNER = re.compile(rb"agora serving ws://\S+")
BANNER_TIMEOUT_S = 900.0
QUIET_WITHIN_S = 30.0
BATCH = 500


async def build(data: Path, workspaces: int, events: int) -> float:
    """Write the data directory; seconds it took."""
    began = time.perf_counter()
    async with open_store(None, data) as store:
        for w in range(workspaces):
            name = f"ws{w:05d}"
            head = [
                MemberJoined(payload=MemberPayload(agent="ann"), producer="ann"),
                ExecRequested(
                    payload=ExecRequestedPayload(exec_id="e1", backend="process", source="true"),
                    producer="ann",
                ),
                ExecFinished(
                    payload=ExecFinishedPayload(exec_id="e1", status="completed", reason="exit"),
                    producer="ann",
                ),
                MemberLeft(payload=MemberPayload(agent="ann", reason="closed"), producer="ann"),
            ]
            drafts = head + [
                MessagePosted(payload=MessagePayload(text=f"message {i} of {name}"), producer="ann")
                for i in range(events - len(head))
            ]
            for start in range(0, len(drafts), BATCH):
                await store.append(name, drafts[start : start + BATCH])
    return time.perf_counter() - began


def _status(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])  # kB
    return fields


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _until_quiet(pid: int, began: float) -> tuple[float, float]:
    """(seconds from ``began`` until ``pid`` was quiet, its CPU seconds by then): quiet is
    four quarter-second polls with under 10 ms of CPU together, bounded by QUIET_WITHIN_S."""
    quiet_polls, last = 0, _cpu_seconds(pid)
    while quiet_polls < 4 and time.perf_counter() - began < QUIET_WITHIN_S:
        time.sleep(0.25)
        now = _cpu_seconds(pid)
        quiet_polls = quiet_polls + 1 if now - last < 0.0025 else 0
        last = now
    return time.perf_counter() - began - 1.0, last


def start_once(data: Path) -> tuple[float, dict[str, int], tuple[float, float]]:
    """Spawn ``agora serve`` on ``data``; (seconds to the banner, memory at that moment,
    (seconds until quiet, CPU seconds by then))."""
    env = dict(os.environ, AGORA_SECRET="bench-secret-" + "x" * 32, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "hub", "serve", "--port", "0", "--no-a2a", "--no-http"]
    argv += ["--data", str(data)]
    began = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    out = b""
    try:
        while not BANNER.search(out):
            left = BANNER_TIMEOUT_S - (time.perf_counter() - began)
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            if not ready:
                raise SystemExit(f"no banner within {BANNER_TIMEOUT_S} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise SystemExit(f"agora serve exited early ({proc.wait()})")
            out += chunk
        elapsed = time.perf_counter() - began
        memory = _status(proc.pid)
        warm = _until_quiet(proc.pid, began)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return elapsed, memory, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspaces", default="10,1000", help="comma-separated counts")
    parser.add_argument("--events", type=int, default=1000, help="events per workspace")
    parser.add_argument("--keep", type=Path, help="build (or reuse) the directories here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="agora-startup-bench-"))
    header = f"{'workspaces':>10} {'events':>9}  {'start':<8} {'seconds':>8} {'RSS MiB':>8}"
    print(f"{header} {'peak MiB':>9} {'quiet s':>8} {'CPU s':>6}")
    try:
        for count in (int(c) for c in args.workspaces.split(",")):
            data = root / f"w{count}-e{args.events}"
            fresh = not (data / "agora.db").exists() and not any(data.glob("*.db"))
            if fresh:
                took = asyncio.run(build(data, count, args.events))
                print(f"# built {count} x {args.events} events in {took:.1f} s", flush=True)
            # A reused directory already has its index: the scan row needs a fresh one.
            for label in ("scan", "indexed") if fresh else ("indexed",):
                seconds, memory, (quiet, cpu) = start_once(data)
                print(
                    f"{count:>10} {count * args.events:>9}  {label:<8} {seconds:>8.2f} "
                    f"{memory.get('VmRSS', 0) / 1024:>8.1f} {memory.get('VmHWM', 0) / 1024:>9.1f}"
                    f" {quiet:>8.2f} {cpu:>6.2f}",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
