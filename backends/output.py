"""The output channel of one execution: two capped streams feeding one bounded queue.

Producers (a backend's pipe readers, the reader of a container's attach socket) call
:meth:`OutputChannel.feed`; the ``execute`` generator drains the channel with
:meth:`OutputChannel.get` and yields each :class:`OutputChunk`. What was kept and written is
read as for every captured output (:class:`backends.captured.CapturedOutput`).

Bounds: each stream keeps at most its cap (:class:`backends.harness.OutputCap`); bytes past it
are read and dropped (counted), so a program never blocks on a full pipe because it wrote too
much. Kept bytes wait in a queue of at most ``queue_size`` chunks: a consumer that stops reading
slows the program down (back-pressure) instead of growing memory.
"""

from __future__ import annotations

import asyncio
from typing import Final

from backends.captured import STREAMS, CapturedOutput
from hub.core.execution.result import OutputChunk, Stream

__all__ = ["STREAMS", "OutputChannel"]

_DONE: Final = None


class OutputChannel(CapturedOutput):
    """Collects one execution's stdout and stderr (see the module docstring). Loop-bound."""

    def __init__(self, max_stdout: int, max_stderr: int, *, queue_size: int = 64) -> None:
        super().__init__(max_stdout, max_stderr)
        # Unbounded queue, bounded by feed(): end-of-stream markers must never wait for room
        # (a producer closing its stream while being cancelled cannot block).
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._queue_size = queue_size
        self._queued = 0  # chunks in the queue (end markers do not count)
        self._room = asyncio.Event()
        self._room.set()
        self._open: set[Stream] = {"stdout", "stderr"}

    async def feed(self, stream: Stream, data: bytes) -> None:
        """Add bytes the program wrote; waits while ``queue_size`` chunks are queued
        (back-pressure). Bytes past the stream's cap return at once."""
        kept = self.caps[stream].feed(data)
        if not kept:
            return
        while self._queued >= self._queue_size:
            self._room.clear()
            await self._room.wait()
        self._emit(stream, kept)

    def close(self, stream: Stream) -> None:
        """End of ``stream`` (idempotent, never waits)."""
        if stream not in self._open:
            return
        self._emit(stream, self.caps[stream].flush())
        self._open.discard(stream)
        self._queue.put_nowait(_DONE)

    def _emit(self, stream: Stream, kept: bytes) -> None:
        if kept:
            self._kept[stream] += kept
            self._queued += 1
            self._queue.put_nowait(OutputChunk(stream, kept))

    async def get(self) -> OutputChunk | None:
        """The next kept chunk in arrival order; ``None`` once both streams are closed."""
        while self._open or not self._queue.empty():
            item = await self._queue.get()
            if item is not None:
                self._queued -= 1
                if self._queued < self._queue_size:
                    self._room.set()
                return item
        return None
