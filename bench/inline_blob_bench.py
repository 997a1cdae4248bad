"""What a publish of inline content over the blob threshold costs (issue #11: the durable
intent written before a new blob, docs/operations.md "Start time").

In-process ``Workspaces`` over a SQLite store on the real disk (the temporary directory is made
beside this file's repository, not in tmpfs): ``--count`` publishes one after the other, each
a ``fileWritten`` of ``--kib`` KiB; ``new``: distinct content each time (a new blob, with its
intent), ``stored``: the same content each time (the blob stored already: a touch). Prints the
median and p90 latency of each, per run, and the medians of ``--repeats`` runs.

    python3 bench/inline_blob_bench.py [--count 200] [--kib 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the repo

from hub.core.events import FileWritten, FileWrittenPayload  # noqa: E402
from hub.log.sqlite import SqliteEventStore  # noqa: E402
from hub.workspaces import Workspaces  # noqa: E402


async def run(count: int, kib: int, *, new: bool) -> tuple[float, float]:
    """(median, p90) seconds of one publish."""
    with tempfile.TemporaryDirectory(dir=REPO) as d:
        root = Path(d)
        async with SqliteEventStore(root / "agora.db", blobs_dir=root / "blobs") as store:
            ws = Workspaces(store)
            same = uuid.uuid4().hex * (kib * 32)
            took: list[float] = []
            for i in range(count):
                text = uuid.uuid4().hex * (kib * 32) if new else same
                draft = FileWritten(payload=FileWrittenPayload(path=f"f{i % 10}", text=text))
                began = time.perf_counter()
                await ws.publish("w", [draft], producer="bench")
                took.append(time.perf_counter() - began)
    took.sort()
    return statistics.median(took), took[int(len(took) * 0.9)]


async def main(args: argparse.Namespace) -> None:
    for new in (True, False):
        name = "new" if new else "stored"
        medians = []
        for _ in range(args.repeats):
            median, p90 = await run(args.count, args.kib, new=new)
            medians.append(median)
            print(f"{name}: median {median * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms")
        print(f"{name}: median of {args.repeats} runs {statistics.median(medians) * 1000:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--kib", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
