"""Event ids the hub mints: time-ordered UUIDs (version 7, RFC 9562; the format and why:
:mod:`hub.core.ids`).

One module for the one way the hub mints ids, used by the SQLite store's writer and by the
pipeline (hub.workspaces) alike; the PostgreSQL store mints uuid4 (hub.log.postgres). The
Python client mints its publishes' ids the same way (hub.client.workspace).
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
