"""Two processes appending to one SQLite file against two processes on two files.

    python bench/shared_file_bench.py [--repeats 3] [--seconds 5] [--writers 64]

Each case starts two child processes (this script with ``--child``), each opening a
:class:`~hub.log.sqlite.SqliteEventStore` on the real disk and keeping ``--writers`` appends
in flight, one per workspace of its own, for ``--seconds``; durable (fsync) as in the hub.
Two cases, alternated in each repeat so they see the same background noise:

- ``one file``: both on one file (what ``agora serve --workers 2`` did on the embedded default
  before its supervisor became the file's one writer, hub.log.handoff): SQLite
  serializes the two writers, and the one that finds the file locked retries under SQLite's
  busy handler, which sleeps between tries (1, 2, 5, 10, ... 100 ms);
- ``two files``: each on a file of its own, the ceiling sharing is measured against (what one
  file per shard of workspaces would give).

Printed per case (medians of ``--repeats``): events/s of both together, the slower process's
share of them, and the append latency p99 and max over both processes (the longest a caller
waited).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


async def child(db: Path, tag: str, writers: int, seconds: float) -> None:
    from hub.core.events import MessagePayload, MessagePosted
    from hub.log.sqlite import SqliteEventStore

    def draft() -> MessagePosted:
        return MessagePosted(producer="bench", payload=MessagePayload(text="x" * 200))

    async with SqliteEventStore(db) as store:
        for i in range(writers):
            await store.append(f"{tag}{i}", [draft()])
        print("ready", flush=True)
        # Both children start together (read off the loop, which must keep running).
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        async def writer(i: int) -> None:
            while (began := time.perf_counter()) < deadline:
                await store.append(f"{tag}{i}", [draft()])
                latencies.append(time.perf_counter() - began)

        start = time.perf_counter()
        await asyncio.gather(*(writer(i) for i in range(writers)))
        elapsed = time.perf_counter() - start
    print(json.dumps({"events": len(latencies), "seconds": elapsed, "latencies": latencies}))


def run_case(directory: Path, files: int, args: argparse.Namespace) -> dict[str, float]:
    procs = []
    for k, tag in enumerate("ab"):
        db = directory / f"log{k if files == 2 else 0}.db"
        argv = [sys.executable, __file__, "--child", str(db), tag, str(args.writers)]
        argv += [str(args.seconds)]
        procs.append(
            subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"child failed ({proc.returncode})")
        results.append(json.loads(out.splitlines()[-1]))
    rates = [r["events"] / r["seconds"] for r in results]
    latencies = sorted(x for r in results for x in r["latencies"])
    return {
        "events/s": sum(rates),
        "slower share": min(rates) / sum(rates),
        "p99 ms": latencies[int(len(latencies) * 0.99)] * 1e3,
        "max ms": latencies[-1] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--writers", type=int, default=64, help="appends in flight per process")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        db, tag, writers, seconds = args.child
        asyncio.run(child(Path(db), tag, int(writers), float(seconds)))
        return
    cases = [("one file", 1), ("two files", 2)]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in cases}
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else None  # the real disk, not tmpfs
    for repeat in range(args.repeats):
        order = cases if repeat % 2 == 0 else cases[::-1]
        for name, files in order:
            with tempfile.TemporaryDirectory(prefix="agora-shared-", dir=base) as d:
                result = run_case(Path(d), files, args)
            results[name].append(result)
            print(
                f"  repeat {repeat + 1} {name}: "
                + ", ".join(f"{k} {v:,.2f}" for k, v in result.items()),
                flush=True,
            )
    print(f"\n2 processes x {args.writers} appends in flight, medians of {args.repeats}")
    ceiling = statistics.median(r["events/s"] for r in results["two files"])
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {name:10} {med['events/s']:9,.0f} events/s ({med['events/s'] / ceiling:.2f}x two "
            f"files)  slower process {med['slower share']:.0%}  p99 {med['p99 ms']:6.1f} ms"
            f"  max {med['max ms']:7.1f} ms"
        )


if __name__ == "__main__":
    main()
