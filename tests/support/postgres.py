"""The PostgreSQL server of the tests: where it is, whether it answers, and a schema per test.

``AGORA_TEST_POSTGRES`` names it (default the local server's ``test`` database). Tests that need
it call :func:`need_postgres` first: without a server they skip, unless ``AGORA_REQUIRE`` lists
``postgres`` (then they fail). Each test works in schemas of its own (:func:`new_schema`), dropped
with CASCADE afterwards (:func:`drop_schemas`), so runs never see each other's rows.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, TypeVar

import asyncpg

from tests.support.require import require

POSTGRES_DSN: Final = os.environ.get(
    "AGORA_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
CONNECT_TIMEOUT_S: Final = 5

_T = TypeVar("_T")


def pg_run(work: Callable[[asyncpg.Connection], Awaitable[_T]], dsn: str = POSTGRES_DSN) -> _T:
    """Run ``work`` on a fresh connection in a thread of its own: callable from sync code and
    from inside a running loop (tamper backdoors and fixture teardowns are sync)."""

    async def main() -> _T:
        conn = await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
        try:
            return await work(conn)
        finally:
            await conn.close()

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, main()).result()


@functools.cache  # probed once per test session: a server does not come and go mid-run
def postgres_unavailable() -> str | None:
    """Why PostgreSQL cannot be used here, or None."""
    try:
        pg_run(lambda conn: conn.fetchval("SELECT 1"))
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
        return f"cannot connect to {POSTGRES_DSN.rsplit('@', 1)[-1]}: {e}"
    return None


def need_postgres() -> None:
    """Skip without a server (fail when ``AGORA_REQUIRE`` lists postgres)."""
    why = postgres_unavailable()
    require("postgres", why is None, why or "")


def new_schema(prefix: str = "t") -> str:
    """A fresh schema name (random, so no clash with what a crashed run left behind)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def url_for(schema: str, dsn: str = POSTGRES_DSN) -> str:
    """The store URL of ``schema`` (``…?schema=NAME``, as ``[storage] store`` takes it)."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}schema={schema}"


def drop_schemas(names: Iterable[str]) -> None:
    """Drop the schemas (CASCADE; missing ones are fine)."""
    doomed = sorted(set(names))
    if not doomed:
        return

    async def drop(conn: asyncpg.Connection) -> None:
        for schema in doomed:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    pg_run(drop)
