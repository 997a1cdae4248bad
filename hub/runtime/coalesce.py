"""Output coalescing: a program's output chunks become few, bounded ``execOutput`` events. Pure.

A chatty program (one ``print`` per loop iteration) must not put one event per write into the
log. :class:`Coalescer` buffers each stream and releases a :class:`Flush` when

* the stream's buffer reaches ``max_bytes`` (64 KiB): flushed at once, in pieces of at most
  ``max_bytes`` (so one event stays well under the event size limit), or
* ``interval`` (50 ms) has passed since the buffer's first byte arrived: :meth:`due`.

At the end, :meth:`drain` releases everything. Each flush gets the next ``n`` (1-based,
contiguous per execution, across both streams). Bytes of one stream keep their order; the
interleaving of stdout and stderr is kept only at flush granularity.

The clock is passed in (seconds, monotonic), so the class has no I/O and no timers: the
runtime asks :meth:`deadline` when to call :meth:`due` next.
"""

from __future__ import annotations

from typing import Final

import msgspec

from hub.core.execution.result import Stream
from hub.core.execution.settings import RuntimeSettings

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_MAX_BYTES", "Coalescer", "Flush"]

DEFAULT_INTERVAL: Final = RuntimeSettings().coalesce_interval_s
DEFAULT_MAX_BYTES: Final = RuntimeSettings().coalesce_bytes
_STREAMS: Final[tuple[Stream, Stream]] = ("stdout", "stderr")


class Flush(msgspec.Struct, frozen=True):
    """One ``execOutput`` to write: ``n`` is its 1-based number within the execution."""

    stream: Stream
    n: int
    data: bytes


class Coalescer:
    """Buffers one execution's output (see the module docstring)."""

    __slots__ = ("_buffers", "_since", "interval", "max_bytes", "n")

    def __init__(
        self,
        *,
        interval: float = DEFAULT_INTERVAL,
        max_bytes: int = DEFAULT_MAX_BYTES,
        first_n: int = 1,
    ) -> None:
        if interval < 0 or max_bytes < 1 or first_n < 1:
            raise ValueError("interval must be >= 0, max_bytes and first_n >= 1")
        self.interval = interval
        self.max_bytes = max_bytes
        self.n = first_n - 1
        """The ``n`` of the last flush released (0: none yet)."""
        self._buffers: dict[Stream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self._since: dict[Stream, float | None] = {"stdout": None, "stderr": None}

    def feed(self, stream: Stream, data: bytes, now: float) -> list[Flush]:
        """Buffer ``data``; return the flushes that are full now (possibly none)."""
        if not data:
            return []
        buffer = self._buffers[stream]
        if self._since[stream] is None:
            self._since[stream] = now
        buffer += data
        out: list[Flush] = []
        while len(buffer) >= self.max_bytes:
            out.append(self._release(stream, bytes(buffer[: self.max_bytes])))
            del buffer[: self.max_bytes]
            self._since[stream] = now if buffer else None
        return out

    def deadline(self) -> float | None:
        """When :meth:`due` will next release something (``None``: nothing is buffered)."""
        times = [t for t in self._since.values() if t is not None]
        return min(times) + self.interval if times else None

    def due(self, now: float) -> list[Flush]:
        """The buffers whose first byte is ``interval`` old or older, flushed (in ``n`` order of
        their age)."""
        ready = sorted(
            (since, stream)
            for stream, since in self._since.items()
            if since is not None and now - since >= self.interval
        )
        return [self._take(stream) for _since, stream in ready]

    def drain(self) -> list[Flush]:
        """Everything still buffered (end of the output), oldest buffer first."""
        ready = sorted(
            (since, stream) for stream, since in self._since.items() if since is not None
        )
        return [self._take(stream) for _since, stream in ready]

    @property
    def pending(self) -> int:
        """Bytes buffered and not yet released."""
        return sum(len(b) for b in self._buffers.values())

    def _take(self, stream: Stream) -> Flush:
        buffer = self._buffers[stream]
        data = bytes(buffer)
        buffer.clear()
        self._since[stream] = None
        return self._release(stream, data)

    def _release(self, stream: Stream, data: bytes) -> Flush:
        self.n += 1
        return Flush(stream, self.n, data)
