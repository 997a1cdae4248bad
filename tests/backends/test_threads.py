"""backends.threads: the daemon thread pool the container backend's engine calls run in."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from backends.threads import DaemonThreadPool
from tests.support.paths import REPO


async def test_results_and_errors_come_back_through_the_loop() -> None:
    pool = DaemonThreadPool(2, thread_name_prefix="t")
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(pool, sum, [1, 2, 3]) == 6
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(pool, lambda: 1 // 0)
    finally:
        pool.shutdown()


def test_at_most_max_workers_run_at_once_and_idle_threads_are_reused() -> None:
    pool = DaemonThreadPool(3, thread_name_prefix="t")
    gate = threading.Event()
    lock = threading.Lock()
    running = peak = 0

    def work() -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        gate.wait(5)
        with lock:
            running -= 1
        return threading.current_thread().name

    futures = [pool.submit(work) for _ in range(10)]
    time.sleep(0.2)
    gate.set()
    names = {f.result(5) for f in futures}
    again = {pool.submit(threading.current_thread).result(5).name for _ in range(20)}
    pool.shutdown()
    assert peak == 3
    assert len(names) == 3 and again <= names  # no thread beyond the three


def test_shutdown_cancels_what_has_not_started() -> None:
    pool = DaemonThreadPool(1, thread_name_prefix="t")
    gate = threading.Event()
    first = pool.submit(gate.wait, 5)
    queued = pool.submit(time.sleep, 0)
    time.sleep(0.1)
    pool.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert first.result(5) is True and queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(time.sleep, 0)


@pytest.mark.parametrize(
    ("pool", "holds"),
    [
        ("backends.threads.DaemonThreadPool(2, thread_name_prefix='t')", False),
        ("concurrent.futures.ThreadPoolExecutor(2)", True),  # the control
    ],
)
def test_a_blocked_call_does_not_hold_the_exit(pool: str, holds: bool) -> None:
    """A call blocked for 30 s (an engine that stopped answering): the process exits at once
    with the daemon pool; the standard pool, the control, joins the thread at exit."""
    script = (
        "import concurrent.futures, time, backends.threads\n"
        f"pool = {pool}\n"
        "pool.submit(time.sleep, 30)\n"
        "time.sleep(0.2)\n"
        "pool.shutdown(wait=False, cancel_futures=True)\n"
    )
    began = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=3, check=True)
        held = False
    except subprocess.TimeoutExpired:
        held = True
    assert held is holds, time.monotonic() - began
