"""The ``wasm`` backend's compiled-module cache: modules by sha256, bounded, LRU."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import wasmtime

__all__ = ["Compiled", "ModuleCache"]

MIB: Final = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# The compiled-module cache


@dataclass
class Compiled:
    module: wasmtime.Module
    pre: wasmtime.InstancePre
    size: int


class ModuleCache:
    """Compiled modules by sha256, least recently used evicted first. Loop-bound.

    Bounded by ``max_entries`` and by ``max_bytes`` of module bytes (a proxy for the compiled
    code's size). Concurrent compilations of one hash share one compilation.
    """

    def __init__(self, max_entries: int = 64, max_bytes: int = 512 * MIB) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self.compile_ms_total = 0.0
        self._items: OrderedDict[str, Compiled] = OrderedDict()
        self._bytes = 0
        self._pending: dict[str, asyncio.Future[Compiled]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self._items

    def get(self, sha256: str) -> Compiled | None:
        item = self._items.get(sha256)
        if item is not None:
            self._items.move_to_end(sha256)
        return item

    def put(self, sha256: str, item: Compiled) -> None:
        old = self._items.pop(sha256, None)
        if old is not None:
            self._bytes -= old.size
        self._items[sha256] = item
        self._bytes += item.size
        while self._items and (len(self._items) > self.max_entries or self._bytes > self.max_bytes):
            _, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.size

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0
