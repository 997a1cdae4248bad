"""What the log store tests need to know about a store kind besides the ``EventStore``
interface (the fixtures in conftest.py build one per kind)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hub.log.base import EventStore


@dataclass(frozen=True)
class StoreKind:
    """``build(tmp_path, name)``: an unopened store over storage ``name`` (same name, same
    data). ``corrupt_body``/``delete_row``: edit the stored event ``(workspace, seq)``
    directly, behind the store's back."""

    build: Callable[[Path, str], EventStore]
    corrupt_body: Callable[[EventStore, str, int, Callable[[bytes], bytes]], None]
    delete_row: Callable[[EventStore, str, int], None]
