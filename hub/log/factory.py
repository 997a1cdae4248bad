"""Choose the log store from a URL: one mapping from scheme to store, nothing else.

``None`` (the default) or ``sqlite://`` → SQLite at ``<data_dir>/agora.db``;
``sqlite:///abs/path/file.db`` → SQLite at that file; SQLite blobs live in
``<data_dir>/blobs``. Given a ``handoff`` socket (a worker of ``agora serve --workers``),
SQLite is a :class:`hub.log.handoff.HandoffStore`: it reads the file and hands its writes to
the process serving that socket, the file's one writer.
``postgresql://user@host:port/db?schema=NAME&pool_size=N`` (or ``postgres://``) →
PostgreSQL, blobs in the database (every node sharing it sees them). New stores add one
entry to ``_SCHEMES``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final
from urllib.parse import unquote, urlsplit

from hub.core.errors import BadRequest
from hub.log.base import EventStore
from hub.log.sqlite import SqliteEventStore

DEFAULT_DB_NAME: Final = "agora.db"
BLOBS_DIR_NAME: Final = "blobs"


def _sqlite(url: str, data_dir: Path, read_only: bool, handoff: Path | None) -> EventStore:
    parts = urlsplit(url)
    if parts.netloc or parts.query or parts.fragment:
        raise BadRequest(
            f"invalid SQLite URL {url!r}: use sqlite:///absolute/path/to/file.db", field="store"
        )
    path = unquote(parts.path)
    db = data_dir / DEFAULT_DB_NAME if path in ("", "/") else Path(path)
    if handoff is not None and not read_only:
        from hub.log.handoff import HandoffStore

        return HandoffStore(db, socket=handoff, blobs_dir=data_dir / BLOBS_DIR_NAME)
    return SqliteEventStore(db, blobs_dir=data_dir / BLOBS_DIR_NAME, read_only=read_only)


def _postgres(url: str, data_dir: Path, read_only: bool, handoff: Path | None) -> EventStore:
    # Imported here: asyncpg is loaded only by hubs that use PostgreSQL.
    from hub.log.postgres import PostgresEventStore

    # Read-only here means only "never migrate": the schema must already be this code's.
    return PostgresEventStore.from_url(url, migrate=not read_only)


# scheme → builder(url, data_dir, read_only, handoff). Builders construct; they do no I/O
# beyond path handling. A store of several writers (PostgreSQL) ignores ``handoff``.
_SCHEMES: Final[dict[str, Callable[[str, Path, bool, Path | None], EventStore]]] = {
    "sqlite": _sqlite,
    "postgresql": _postgres,
    "postgres": _postgres,
}


def open_store(
    url: str | None, data_dir: Path, *, read_only: bool = False, handoff: Path | None = None
) -> EventStore:
    """The store for ``url`` (not yet opened: use ``async with open_store(...) as store``).

    Creates ``data_dir``, unless ``read_only``: then the store only reads what exists (SQLite
    opens the file read-only, with no writer; PostgreSQL does not migrate). ``handoff``: the
    socket of the file's one writer (SQLite under ``agora serve --workers``; see the module
    docstring). Raises
    :class:`BadRequest` for an unknown scheme or a malformed URL, :class:`OSError` if
    ``data_dir`` cannot be created.
    """
    data_dir = Path(data_dir)
    url = url or "sqlite://"
    scheme, sep, _ = url.partition("://")
    if not sep:
        scheme = "(none)"
    builder = _SCHEMES.get(scheme.lower())
    if builder is None:
        known = ", ".join(f"{s}://" for s in sorted(_SCHEMES))
        raise BadRequest(
            # Only the scheme is echoed: a store URL may carry a password.
            f"unknown store URL scheme {scheme!r}: supported are {known}",
            field="store",
        )
    if not read_only:
        data_dir.mkdir(parents=True, exist_ok=True)
    return builder(url, data_dir, read_only, handoff)
