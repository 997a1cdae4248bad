"""Event ids the hub mints: time-ordered UUIDs (version 7, RFC 9562; the format and why:
:mod:`hub.core.ids`).

One module for the one way the hub mints ids, used by both stores' writers and by the pipeline
(hub.workspaces) alike; the Python client mints its publishes' ids the same way
(hub.client.workspace). On PostgreSQL too the index favours them: 64 writers on one store
(bench/store_bench.py's setup, 8 workspaces, 4 alternated pairs) appended 14,984 and 16,190
events/s with uuid4 ids, 17,487 and 18,173 with these (medians of 4, two runs).
"""

from __future__ import annotations

import os

from hub.core.ids import RANDOM_BYTES, format_uuid7s

__all__ = ["mint_id", "mint_ids"]


def mint_ids(timestamp_ms: int, count: int) -> list[str]:
    """``count`` new event ids for ``timestamp_ms``; one ``urandom`` call serves them all
    (74 random bits per id keep them unique across hubs)."""
    return format_uuid7s(timestamp_ms, os.urandom(RANDOM_BYTES * count))


def mint_id(timestamp_ms: int) -> str:
    """One new event id (see :func:`mint_ids`)."""
    return mint_ids(timestamp_ms, 1)[0]
