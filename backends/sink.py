"""Output of a program that runs in a worker thread: capped streams fed from any thread.

The in-process sandboxes (``wasm``: wasmtime's WASI output callbacks; ``python``: Monty's print
callback) deliver output on a thread that is not the event loop's, and cannot wait for room in
a queue. :class:`ThreadedOutput` applies each stream's :class:`~backends.harness.OutputCap` on
the producing thread (under a lock) and hands the kept bytes to the loop with
``call_soon_threadsafe``. Bounds: a stream keeps at most its cap, so the pending chunks hold at
most ``max_stdout + max_stderr`` bytes whatever the program writes; bytes past a cap are counted
and dropped at once, so the program never blocks on its output.

(:class:`backends.output.OutputChannel` is the loop-side equivalent with back-pressure, for
producers that can await.)
"""

from __future__ import annotations

import asyncio
import threading

from backends.captured import CapturedOutput
from hub.core.execution.result import OutputChunk, Stream

__all__ = ["ThreadedOutput"]


class ThreadedOutput(CapturedOutput):
    """Two capped streams fed from any thread, drained on the loop that created it."""

    def __init__(self, max_stdout: int, max_stderr: int) -> None:
        super().__init__(max_stdout, max_stderr)
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._closed = False

    def feed(self, stream: Stream, data: bytes) -> None:
        """Add bytes the program wrote (any thread; never blocks for long)."""
        with self._lock:
            if self._closed:
                return
            kept = self.caps[stream].feed(data)
            if kept:
                self._kept[stream] += kept
        if kept:
            self._post(OutputChunk(stream, kept))

    def close(self) -> None:
        """End of both streams (any thread; idempotent): flush held-back bytes, wake the
        consumer."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            tails: list[OutputChunk] = []
            for stream, cap in self.caps.items():
                tail = cap.flush()
                if tail:
                    self._kept[stream] += tail
                    tails.append(OutputChunk(stream, tail))
        for chunk in tails:
            self._post(chunk)
        self._post(None)

    def _post(self, item: OutputChunk | None) -> None:
        # Always through the loop's ready queue (call_soon even on the loop's own thread), so
        # the end marker can never overtake chunks a worker thread posted before it.
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is self._loop:
                self._loop.call_soon(self._queue.put_nowait, item)
            else:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening any more

    async def get(self) -> OutputChunk | None:
        """The next kept chunk in arrival order; ``None`` once closed and drained."""
        return await self._queue.get()

    def kept(self, stream: Stream) -> bytes:
        with self._lock:
            return super().kept(stream)
