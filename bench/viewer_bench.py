"""Benchmark of the web viewer on a 100,000-event timeline, in headless Debian Chromium.

    python bench/viewer_bench.py [--events N] [--repeats R] [--frames F]

A real ``agora serve`` (subprocess, SQLite, a config that lifts the publish rate so seeding is
quick) gets a workspace of N events (default 100,000: chat messages, a file write every 50th,
a work item every 100th) published over WebSocket in batches of 256. Then, R times (default
3), a fresh browser page signs in and opens ``/ui/w/bench``:

- **first screen**: navigation start → the first timeline rows are on screen (the catch-up
  streams in; rows show before it ends);
- **all loaded**: navigation start → every event received and the timeline says ``live``;
- **scrolling** (after a 1 s pause, so the catch-up's garbage collection is not counted): F
  animation frames (default 240) scrolling the virtualised list by 400 px a
  frame (about 17 rows) from top to bottom, once with no filter and once filtered by kind;
  the frame time is the interval between ``requestAnimationFrame`` callbacks (16.7 ms = 60 Hz),
  median, p95 and max, and how many frames took over 50 ms;
- **first text search**: typing a search that matches one event → the view shows it (the
  first search builds each event's search text, so later ones are faster).

Prints the medians over the repeats. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.hub import HubStarter  # noqa: E402
from tests.support.peer import peer  # noqa: E402
from tests.support.require import CHROMIUM  # noqa: E402

WORKSPACE = "bench"
SETTLE_MS = 1000
BATCH = 256
CONFIG = """
[limits]
publish_rate = 1000000.0
publish_burst = 1000000
"""

SCROLL_JS = """
async ([frames, step]) => {
  const box = document.querySelector('[data-testid=timeline]');
  box.scrollTop = 0;
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  const times = [];
  let last = performance.now();
  for (let i = 0; i < frames; i++) {
    box.scrollTop += step;
    await new Promise((r) => requestAnimationFrame(r));
    const now = performance.now();
    times.push(now - last);
    last = now;
  }
  return times;
}
"""


def draft(i: int) -> dict[str, Any]:
    if i % 100 == 0:
        return {"kind": "needWork", "correlationId": f"task-{i // 100}", "payload": {"n": i}}
    if i % 50 == 0:
        return {"kind": "fileWritten", "payload": {"path": f"src/f{i % 20}.txt", "text": str(i)}}
    return {"kind": "messagePosted", "payload": {"text": f"message {i} from the benchmark"}}


async def seed(url: str, token: str, count: int) -> float:
    started = time.perf_counter()
    async with peer(url, token) as p:
        for start in range(0, count, BATCH):
            events = [draft(i) for i in range(start, min(count, start + BATCH))]
            reply = await p.call("publish", workspace=WORKSPACE, events=events, within=120)
            assert reply["op"] == "ack", reply
    return time.perf_counter() - started


def stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median": statistics.median(ordered),
        "p95": ordered[int(len(ordered) * 0.95) - 1],
        "max": ordered[-1],
        "over50": float(sum(1 for t in ordered if t > 50)),
    }


async def one_run(browser: Any, http_url: str, token: str, count: int, frames: int) -> dict:
    from playwright.async_api import expect

    context = await browser.new_context(viewport={"width": 1400, "height": 860})
    page = await context.new_page()
    await page.goto(http_url + "/ui/")
    await expect(page.get_by_test_id("ws-url")).not_to_have_value("", timeout=30_000)
    await page.get_by_test_id("token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_test_id("workspaces")).to_be_visible(timeout=30_000)
    started = time.perf_counter()
    await page.get_by_role("link", name=WORKSPACE).click()
    await page.locator("[data-testid=timeline] .row").first.wait_for(timeout=120_000)
    first = time.perf_counter() - started
    await expect(page.get_by_test_id("live")).to_have_text("● live", timeout=300_000)
    await page.wait_for_function(  # N seeded + the presence events of the viewer's runs
        "n => parseInt(document.querySelector('[data-testid=timeline-count]')"
        ".textContent.split('/')[1]) >= n",
        arg=count,
        timeout=300_000,
    )
    loaded = time.perf_counter() - started
    await page.wait_for_timeout(SETTLE_MS)  # let the catch-up's garbage be collected first
    plain = stats(await page.evaluate(SCROLL_JS, [frames, 400]))
    await page.get_by_test_id("filter-kind").select_option("messagePosted")
    filtered = stats(await page.evaluate(SCROLL_JS, [frames, 400]))
    await page.get_by_test_id("filter-kind").select_option("")
    searched = time.perf_counter()
    await page.get_by_test_id("filter-text").fill("message 77777 from")
    await page.wait_for_function(
        "() => document.querySelector('[data-testid=timeline-count]')"
        ".textContent.startsWith('1 /')",
        timeout=60_000,
    )
    search = time.perf_counter() - searched
    heap = await page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : 0")
    await context.close()
    return {
        "first": first,
        "loaded": loaded,
        "plain": plain,
        "filtered": filtered,
        "search": search,
        "heap": heap,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=240)
    args = parser.parse_args()
    executable = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if executable is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    from playwright.async_api import async_playwright

    root = Path(tempfile.mkdtemp(prefix="agora-viewer-bench-"))
    starter = HubStarter(root)
    try:
        hub = starter.start(CONFIG, a2a_port=0)
        seeded = await seed(hub.url, hub.token("bench"), args.events)
        print(f"seeded {args.events} events in {seeded:.1f} s", flush=True)
        token = hub.token("auditor", [WORKSPACE], ["read"])
        runs = []
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=executable, headless=True)
            for i in range(args.repeats):
                run = await one_run(browser, hub.a2a_url, token, args.events, args.frames)
                runs.append(run)
                print(f"run {i + 1}: {json.dumps(run)}", flush=True)
            await browser.close()
    finally:
        starter.close()
        shutil.rmtree(root, ignore_errors=True)

    def med(pick: Any) -> float:
        return statistics.median(pick(r) for r in runs)

    print()
    print(f"viewer, {args.events} events, median of {len(runs)} runs (headless Chromium)")
    print(f"  first screen (rows visible)    {med(lambda r: r['first']) * 1000:8.0f} ms")
    print(f"  all events loaded, live        {med(lambda r: r['loaded']) * 1000:8.0f} ms")
    for name in ("plain", "filtered"):
        m = {k: statistics.median(r[name][k] for r in runs) for k in runs[0][name]}
        print(
            f"  scroll frame ({name:8})        median {m['median']:5.1f} ms  p95 {m['p95']:5.1f}"
            f" ms  max {m['max']:5.1f} ms  frames >50 ms {m['over50']:.0f}/{args.frames}"
        )
    print(f"  first text search (100k scan)  {med(lambda r: r['search']) * 1000:8.0f} ms")
    print(f"  JS heap after load             {med(lambda r: r['heap']) / 2**20:8.1f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
