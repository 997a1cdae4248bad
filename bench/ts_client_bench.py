"""publish → ack latency of the TypeScript client (clients/typescript) beside the Python client
(``hub.client``), against one ``agora serve``, in one run.

    python bench/ts_client_bench.py [--n 2000] [--warmup 100] [--repeats 3]

One hub (a subprocess, SQLite under a temporary directory, durable appends in the path, the
test launcher of tests/support/hub.py). Each client publishes one ``messagePosted`` (64
characters, client-minted id) at a time and waits for its ack; the time from the call to the
returned ack is one sample. The Python client runs in this process (``hub.client.connect``),
the TypeScript client in a node subprocess (clients/typescript/bench/publish.mjs), each to its
own workspace, one after the other (alternating, ``--repeats`` rounds), so they never compete
for the two cores. Prints p50/p99/mean per client: the median over the rounds of each round's
figure. Builds the TypeScript client first (``npm ci`` when needed, ``npm run build``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hub.client import connect  # noqa: E402
from tests.support.hub import HubStarter  # noqa: E402
from tests.support.node import CLIENT_DIR, build, node_env  # noqa: E402

TEXT = "x" * 64


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def python_round(url: str, token: str, workspace: str, n: int, warmup: int) -> list[float]:
    async with connect(url, token) as session:
        ws = session.workspace(workspace)
        for _ in range(warmup):
            await ws.post_message(TEXT)
        out = []
        for _ in range(n):
            start = time.perf_counter()
            await ws.publish({"kind": "messagePosted", "payload": {"text": TEXT}})
            out.append((time.perf_counter() - start) * 1000)
        return out


def ts_round(node: str, url: str, token: str, workspace: str, n: int, warmup: int) -> list[float]:
    script = CLIENT_DIR / "bench" / "publish.mjs"
    proc = subprocess.run(
        [node, str(script), url, token, workspace, str(n), str(warmup)],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        env=node_env(),
        check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    latencies: list[float] = result["latenciesMs"]
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="timed publishes per round")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        sys.exit("node and npm are needed")
    build(npm)
    figures: dict[str, dict[str, list[float]]] = {
        c: {"p50": [], "p99": [], "mean": []} for c in ("python", "typescript")
    }
    with tempfile.TemporaryDirectory(prefix="agora-ts-bench-") as tmp:
        starter = HubStarter(Path(tmp))
        hub = starter.start()
        try:
            for r in range(args.repeats):  # bounded: --repeats rounds of --n publishes
                runs: dict[str, list[float]] = {}
                # Alternate which client goes first: a hub warming up favours neither.
                for client in ("python", "typescript") if r % 2 == 0 else ("typescript", "python"):
                    if client == "python":
                        token = hub.token("py")
                        runs[client] = asyncio.run(
                            python_round(hub.url, token, f"py-{r}", args.n, args.warmup)
                        )
                    else:
                        token = hub.token("ts")
                        runs[client] = ts_round(
                            node, hub.url, token, f"ts-{r}", args.n, args.warmup
                        )
                for client, samples in runs.items():
                    figures[client]["p50"].append(percentile(samples, 0.50))
                    figures[client]["p99"].append(percentile(samples, 0.99))
                    figures[client]["mean"].append(statistics.fmean(samples))
        finally:
            starter.close()
    print(f"publish -> ack, {args.n} sequential publishes, median of {args.repeats} rounds")
    print(f"{'client':<12} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for client, f in figures.items():
        p50, p99 = statistics.median(f["p50"]), statistics.median(f["p99"])
        mean = statistics.median(f["mean"])
        print(f"{client:<12} {p50:>8.3f} {p99:>8.3f} {mean:>8.3f}")


if __name__ == "__main__":
    main()
