"""``agora db migrate``: create or upgrade the PostgreSQL schema of the event store.

A PostgreSQL store also migrates itself when it opens; this command lets an operator do it
ahead of a rolling upgrade (old nodes refuse a schema newer than they know, so migrate when the
last old node is gone) or with a more privileged role than the hub runs as. It prints the
schema's version. Exit codes: 0 done; 1 the database is unreachable or its schema is newer than
this hub knows; 2 usage (no store URL, not a PostgreSQL URL, a bad configuration file).
SQLite needs no command: its store creates and upgrades its file on open.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from hub.commands.common import add_config_arg, config_from_args, fail
from hub.core.errors import AgoraError, BadRequest, ConfigError

COMMAND: Final = "db migrate"
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def register(subparsers: Any) -> None:
    """Add ``db migrate`` to the ``agora`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "db", help="manage the PostgreSQL schema of the event store"
    )
    actions = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    migrate = actions.add_parser(
        "migrate",
        help="create or upgrade the store's PostgreSQL schema and print its version",
        description=(
            "Apply every missing migration to the PostgreSQL schema named by --store "
            "(postgresql://user@host:port/db?schema=NAME; schema 'agora' by default), in one "
            "transaction, and print the resulting version. Safe to run again, and while hubs "
            "are running."
        ),
    )
    migrate.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="postgresql://… (default: [storage] store of the configuration file)",
    )
    add_config_arg(migrate)
    migrate.set_defaults(func=run_migrate)


async def run_migrate(args: argparse.Namespace) -> int:
    # Imported here: asyncpg is only needed by this command and the PostgreSQL store.
    from hub.log.postgres import URL_SCHEMES, PostgresEventStore

    try:
        url = config_from_args(args).storage.store
        if url is None:
            return fail(COMMAND, "no store URL: pass --store postgresql://…", EXIT_USAGE)
        if url.partition("://")[0].lower() not in URL_SCHEMES:
            return fail(
                COMMAND,
                "only a PostgreSQL store (postgresql://…) has a schema to migrate; "
                "SQLite migrates itself when opened",
                EXIT_USAGE,
            )
        store = PostgresEventStore.from_url(url)
    except (BadRequest, ConfigError) as e:  # ConfigError, or a malformed URL or option
        return fail(COMMAND, e, EXIT_USAGE)
    try:
        before, after = await store.migrate_schema()
    except AgoraError as e:
        return fail(COMMAND, f"{e.code}: {e.message}", EXIT_FAILED)
    if before == after:
        print(f"schema {store.schema}: version {after} (up to date)")
    else:
        print(f"schema {store.schema}: version {after} (migrated from {before})")
    return EXIT_OK
