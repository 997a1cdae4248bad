"""A thread pool whose threads never hold the process's exit: for blocking calls to a service
that may stop answering (the Docker engine).

:class:`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits,
so one call blocked in a socket read (an engine that hangs, up to the call's own 60 s timeout,
and calls queued behind it) kept a stopped hub alive long after it had closed everything
else. :class:`DaemonThreadPool` is the same bounded pool with daemon threads, never joined at
exit: what a hung call was doing is abandoned with the process, as the hub's stop already
decided (hub.runtime: ``close_grace_s``). Everything else works as with the standard pool:
``loop.run_in_executor(pool, fn)``, at most ``max_workers`` calls at once, :meth:`shutdown`.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["DaemonThreadPool"]

T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadPool(Executor):
    """At most ``max_workers`` daemon threads (started as calls come) running the submitted
    calls in order (see the module docstring)."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._numbers = itertools.count()
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            future: Future[T] = Future()
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._prefix}_{next(self._numbers)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1  # (that thread takes this call; it counts itself idle again)
            return future

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del item, future  # (no reference to a result kept while idle)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
