"""The scale-out log store: PostgreSQL through asyncpg, shared by several hub nodes.

Same interface and semantics as :class:`hub.log.sqlite.SqliteEventStore` (the conformance
suite in tests/hub/log runs on both); what differs is how it stays correct with several
writers, each a hub node with its own store instance:

* **Commit order = position order.** Every writing transaction first takes
  ``LOCK TABLE events IN EXCLUSIVE MODE`` (eventsourcing's choice), then assigns positions from
  ``max(position) + 1``. The lock conflicts with every other writer's lock (and any stray
  ``INSERT``) but not with readers' ``SELECT``, and is held until COMMIT, so transactions that
  write events are serialized: positions are gapless and a transaction's events become visible
  before the next writer even reads ``max(position)``. A reader following ``read_all`` by
  position can therefore never see position *n + 1* while *n* is still to come. A sequence
  would not do: ``nextval`` is not transactional, so a transaction could take 5, another 6 and
  commit first, and a follower at 6 would skip 5 forever. The lock is scoped to the schema's
  table (stores in other schemas never wait for each other) and bounded by ``lock_timeout``.
  docs/operations.md, "PostgreSQL", has the discussion.
* **One writer, group commit.** As in the SQLite store: ``append`` enqueues on a bounded queue;
  one writer task owned by the store drains every queued request (up to ``batch_max`` events)
  into ONE transaction: lock, read the heads of the workspaces involved and the already-stored
  ids, check and seal every request in memory, then one statement inserts every row, updates
  ``heads`` and sends the notifications. One request's ``Conflict`` never fails the others;
  a failed transaction fails every request of the batch with :class:`Unavailable` (then
  nothing of it was written, except when the connection died during COMMIT itself: the outcome
  is then unknown, and a retry with the same ids answers ``duplicate`` if it was written).
* **Heads are read inside the transaction** (never cached across transactions) because other
  nodes write too; ``heads`` is a table maintained in the same transaction as the events.
* **NOTIFY.** Each committing transaction calls ``pg_notify(channel, '<workspace>:<seq>')``
  once per workspace it wrote, with that workspace's new head. PostgreSQL delivers
  notifications only on COMMIT, in commit order, so a listener never hears of an event it
  cannot read. The payload is a hint ("read after your last seq"), never the events.
* **Schema** is created and migrated by the store (:mod:`hub.log.migrations`); ``open`` refuses
  a schema newer than this code knows.

The body column holds ``encode_event`` of the full sealed event; the other columns are indexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Final, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import asyncpg.pool
import msgspec

from hub.chain import GENESIS, seal, verify_chain
from hub.errors import (
    AgoraError,
    BadRequest,
    Conflict,
    IntegrityError,
    Internal,
    NotFound,
    TooLarge,
    Unavailable,
)
from hub.events import EVENT_TYPES, Event, decode_event, decode_events, encode_event
from hub.log.base import AppendResult, BlobStore, EventStore, Head, Snapshot, VerifyReport
from hub.log.blobs import DEFAULT_MAX_BLOB_BYTES
from hub.log.migrations import Conn, check_version, migrate, quote, validate_schema
from hub.validation import SHA256_RE, validate_workspace

DEFAULT_SCHEMA: Final = "agora"
DEFAULT_POOL_SIZE: Final = 10
DEFAULT_QUEUE_MAX: Final = 4096
DEFAULT_BATCH_MAX: Final = 1024
DEFAULT_LOCK_TIMEOUT_S: Final = 10.0
DEFAULT_COMMAND_TIMEOUT_S: Final = 60.0
# ``follow``: how often the LISTEN connection is checked, and the reconnect backoff bounds.
FOLLOW_KEEPALIVE_S: Final = 5.0
FOLLOW_BACKOFF_S: Final = (0.1, 5.0)
URL_SCHEMES: Final = ("postgresql", "postgres")
# URL query options the store takes for itself (the rest of the URL goes to asyncpg as is).
_STORE_OPTIONS: Final = ("schema", "pool_size")

_MAX_SEQ: Final = 2**63 - 1
_KINDS_BY_TYPE: Final[dict[type[Event], str]] = {t: t.kind for t in EVENT_TYPES}

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"

# (seq, hash, position, timestamp) of a workspace's last event.
_Tip: TypeAlias = tuple[int, str, int, int]
_EMPTY_TIP: Final[_Tip] = (0, GENESIS, 0, 0)


class _Rows:
    """Column arrays for one multi-row ``INSERT … SELECT FROM unnest(…)``."""

    __slots__ = ("body", "hash", "id", "kind", "position", "seq", "timestamp", "workspace")

    def __init__(self) -> None:
        self.position: list[int] = []
        self.workspace: list[str] = []
        self.seq: list[int] = []
        self.id: list[str] = []
        self.kind: list[str] = []
        self.timestamp: list[int] = []
        self.hash: list[str] = []
        self.body: list[bytes] = []

    def add(self, event: Event, body: bytes) -> None:
        self.position.append(event.position)
        self.workspace.append(event.workspace)
        self.seq.append(event.seq)
        self.id.append(event.id)
        self.kind.append(event.kind)
        self.timestamp.append(event.timestamp)
        self.hash.append(event.hash or GENESIS)
        self.body.append(body)

    def __len__(self) -> int:
        return len(self.position)

    def columns(self) -> tuple[list[Any], ...]:
        return (
            self.position,
            self.workspace,
            self.seq,
            self.id,
            self.kind,
            self.timestamp,
            self.hash,
            self.body,
        )


class _Append:
    """One queued ``append`` call."""

    __slots__ = ("client_ids", "drafts", "expected_seq", "future", "size", "workspace")

    def __init__(
        self,
        workspace: str,
        drafts: tuple[Event, ...],
        expected_seq: int | None,
        client_ids: list[str],
        future: asyncio.Future[Any],
    ) -> None:
        self.workspace = workspace
        self.drafts = drafts
        self.expected_seq = expected_seq
        self.client_ids = client_ids
        self.future = future
        self.size = len(drafts)


class _Import:
    """One queued ``import_events`` call (events already verified)."""

    __slots__ = ("events", "future", "size", "workspace")

    def __init__(
        self, workspace: str, events: tuple[Event, ...], future: asyncio.Future[Any]
    ) -> None:
        self.workspace = workspace
        self.events = events
        self.future = future
        self.size = len(events)


_Request: TypeAlias = _Append | _Import
_Outcome: TypeAlias = AppendResult | int | AgoraError


class _Stop:
    """Wakes the writer task when the store closes."""


_STOP: Final = _Stop()

# SQLSTATE classes that mean "the database is unreachable or busy; retry later": connection
# exceptions, insufficient resources, operator intervention (shutdown, cancel), transaction
# rollback (serialization failure, deadlock), lock not available, system errors.
_UNAVAILABLE_CLASSES: Final = ("08", "53", "57", "40", "58", "55P03")
_DRIVER_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

log = logging.getLogger(__name__)


def _translate(e: BaseException, doing: str) -> AgoraError:
    """Map a driver error to the hub's taxonomy (the one place this happens)."""
    if isinstance(e, AgoraError):
        return e
    if isinstance(e, asyncpg.PostgresError):
        state = str(getattr(e, "sqlstate", "") or "")
        if state.startswith(_UNAVAILABLE_CLASSES):
            return Unavailable(f"PostgreSQL unavailable while {doing}: {e}", sqlstate=state)
        return Internal(f"PostgreSQL error while {doing}: {e}", sqlstate=state)
    if isinstance(e, TimeoutError):
        return Unavailable(f"PostgreSQL timed out while {doing}")
    return Unavailable(f"PostgreSQL unavailable while {doing}: {e}")


def _storable(text: str) -> bool:
    """Whether PostgreSQL can hold ``text`` in a TEXT column: valid UTF-8 without NUL. (SQLite
    can; a name or id that is not storable here cannot have been written, so a lookup by it
    finds nothing and an append with it is a bad request.)"""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _chain(error: AgoraError, cause: BaseException) -> AgoraError:
    """``raise error from cause`` for an error handed to a waiting caller's future."""
    error.__cause__ = cause
    return error


def _decode_page(bodies: list[bytes], keys: Iterable[int], key_name: str) -> list[Event]:
    """Decode stored bodies in one call. Raises :class:`IntegrityError` naming a bad row."""
    if not bodies:
        return []
    try:
        return decode_events(b"[" + b",".join(bodies) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        for key, body in zip(keys, bodies, strict=True):
            try:
                decode_event(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as bad:
                raise IntegrityError(
                    f"stored event at {key_name} {key} cannot be decoded: {bad}",
                    **{key_name: key},
                ) from bad
        raise IntegrityError(f"stored events cannot be decoded: {e}") from e


class _Sql:
    """Every statement, with the schema filled in once."""

    def __init__(self, schema: str) -> None:
        s = quote(schema)
        self.lock = f"LOCK TABLE {s}.events IN EXCLUSIVE MODE"
        # The last position and the heads of the workspaces of a batch, in one round trip:
        # always one row (workspace NULL when none of them has a head yet).
        self.tips = f"""
            SELECT (SELECT COALESCE(MAX(position), 0) FROM {s}.events) AS last,
                   h.workspace, h.seq, h.hash, h.position, h.timestamp
            FROM (VALUES (1)) AS one
            LEFT JOIN {s}.heads AS h ON h.workspace = ANY($1::text[])
        """
        self.known_ids = (
            f"SELECT e.workspace, e.id FROM {s}.events AS e "
            "JOIN unnest($1::text[], $2::text[]) AS k(workspace, id) "
            "ON e.workspace = k.workspace AND e.id = k.id"
        )
        self.bodies_by_id = (
            f"SELECT seq, body FROM {s}.events WHERE workspace = $1 AND id = ANY($2::text[]) "
            "ORDER BY seq"
        )
        # One round trip writes the rows, moves the heads and queues the notifications
        # (data-modifying CTEs always run to completion, referenced or not).
        self.write = f"""
            WITH inserted AS (
                INSERT INTO {s}.events
                    (position, workspace, seq, id, kind, timestamp, hash, body)
                SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[],
                                     $5::text[], $6::bigint[], $7::text[], $8::bytea[])
            ), moved AS (
                INSERT INTO {s}.heads AS h (workspace, seq, hash, position, timestamp)
                SELECT * FROM unnest($9::text[], $10::bigint[], $11::text[], $12::bigint[],
                                     $13::bigint[])
                ON CONFLICT (workspace) DO UPDATE
                SET seq = EXCLUDED.seq, hash = EXCLUDED.hash, position = EXCLUDED.position,
                    timestamp = EXCLUDED.timestamp
            )
            SELECT count(pg_notify($14, p)) FROM unnest($15::text[]) AS p
        """
        self.head = (
            f"SELECT workspace, seq, hash, timestamp, position FROM {s}.heads WHERE workspace = $1"
        )
        self.heads = (
            f"SELECT workspace, seq, hash, timestamp, position FROM {s}.heads "
            'ORDER BY workspace COLLATE "C"'
        )
        self.range = (
            f"SELECT seq, body FROM {s}.events WHERE workspace = $1 AND seq > $2 AND seq <= $3 "
            "ORDER BY seq LIMIT $4"
        )
        self.all = (
            f"SELECT position, body FROM {s}.events WHERE position > $1 ORDER BY position LIMIT $2"
        )
        self.save_snapshot = (
            f"INSERT INTO {s}.snapshots (workspace, name, version, seq, body) "
            "VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (workspace, name, version, seq) DO UPDATE SET body = EXCLUDED.body"
        )
        self.load_snapshot = (
            f"SELECT seq, body FROM {s}.snapshots WHERE workspace = $1 AND name = $2 "
            "AND version = $3 AND seq <= $4 ORDER BY seq DESC LIMIT 1"
        )
        self.delete_snapshots = f"DELETE FROM {s}.snapshots WHERE workspace = $1"
        self.delete_all_snapshots = f"DELETE FROM {s}.snapshots"
        self.blob_put = (
            f"INSERT INTO {s}.blobs (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING"
        )
        self.blob_get = f"SELECT data FROM {s}.blobs WHERE sha256 = $1"
        self.blob_has = f"SELECT EXISTS (SELECT 1 FROM {s}.blobs WHERE sha256 = $1)"


def _rowcount(status: str) -> int:
    """The row count of a command tag such as ``DELETE 3``."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class PostgresBlobStore(BlobStore):
    """Blobs in the ``blobs`` table of the store's schema (``sha256`` primary key, ``data``
    BYTEA), so every hub node sharing the database sees them.

    ``pool`` returns the owning store's connection pool (raising :class:`Unavailable` when
    it is closed). ``max_bytes`` bounds one blob (PostgreSQL's own limit for a value is 1 GB).
    """

    def __init__(
        self,
        pool: Callable[[], Pool],
        schema: str,
        *,
        max_bytes: int = DEFAULT_MAX_BLOB_BYTES,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self._pool = pool
        self._sql = _Sql(validate_schema(schema))
        self.max_bytes = max_bytes

    @staticmethod
    def _check(sha256: str) -> str:
        if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
            raise BadRequest("blob id must be a lowercase hex sha256", field="sha256")
        return sha256

    async def put(self, data: bytes) -> str:
        """Store ``data``; return its sha256. Idempotent. Raises :class:`TooLarge` above
        ``max_bytes``, :class:`Unavailable` when the database is unreachable."""
        if len(data) > self.max_bytes:
            raise TooLarge(
                f"blob is {len(data)} bytes; the limit is {self.max_bytes}",
                size=len(data),
                limit=self.max_bytes,
            )
        data = bytes(data)
        digest = await _sha256(data)
        try:
            await self._pool().execute(self._sql.blob_put, digest, data)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "storing a blob") from e
        return digest

    async def get(self, sha256: str) -> bytes:
        """The blob's content, checked against its hash. Raises :class:`NotFound`,
        :class:`BadRequest` for a malformed hash, :class:`IntegrityError` if the stored bytes
        no longer match, :class:`Unavailable`."""
        self._check(sha256)
        try:
            data = await self._pool().fetchval(self._sql.blob_get, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "reading a blob") from e
        if data is None:
            raise NotFound(f"blob {sha256} not found", sha256=sha256)
        data = bytes(data)
        if await _sha256(data) != sha256:
            raise IntegrityError(f"blob {sha256} does not match its hash", sha256=sha256)
        return data

    async def has(self, sha256: str) -> bool:
        """Whether the blob is stored. Raises :class:`BadRequest`, :class:`Unavailable`."""
        self._check(sha256)
        try:
            return bool(await self._pool().fetchval(self._sql.blob_has, sha256))
        except _DRIVER_ERRORS as e:
            raise _translate(e, "looking up a blob") from e


async def _sha256(data: bytes) -> str:
    if len(data) < 1 << 20:
        return hashlib.sha256(data).hexdigest()
    # Hashing megabytes is CPU work; keep it off the event loop.
    return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())


def parse_url(url: str) -> tuple[str, dict[str, str]]:
    """Split a store URL into the DSN asyncpg gets and the store's own options (``schema``,
    ``pool_size`` query parameters). Raises :class:`BadRequest` for another scheme."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in URL_SCHEMES:
        raise BadRequest(f"not a PostgreSQL URL (scheme {parts.scheme!r})", field="store")
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {k: v for k, v in query if k in _STORE_OPTIONS}
    rest = [(k, v) for k, v in query if k not in _STORE_OPTIONS]
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
    return dsn, options


class PostgresEventStore(EventStore):
    """The PostgreSQL :class:`EventStore` (see the module docstring for the design).

    ``dsn``: a libpq-style URL or DSN for asyncpg. ``schema``: the PostgreSQL schema holding the
    tables (created if absent; one schema per independent hub). ``blobs``: where blobs live
    (default: a :class:`PostgresBlobStore` in the same schema). ``pool_size``: connections
    for readers and the writer. ``migrate``: apply missing schema migrations on ``open``
    (else ``open`` refuses an old schema). ``batch_max``: the most events one group commit
    writes (a larger single request is written alone). ``queue_max``: the most requests
    waiting for the writer; ``append`` then waits for room. ``lock_timeout``: seconds to wait
    for the log's write lock held by another node before failing with :class:`Unavailable`.
    ``channel``: the NOTIFY channel (default ``<schema>_events``, so ``agora_events``).
    """

    shared = True  # every hub node sharing the database appends to the same log

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        blobs: BlobStore | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        migrate: bool = True,
        batch_max: int = DEFAULT_BATCH_MAX,
        queue_max: int = DEFAULT_QUEUE_MAX,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT_S,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT_S,
        channel: str | None = None,
    ) -> None:
        if pool_size < 1 or batch_max < 1 or queue_max < 1:
            raise ValueError("pool_size, batch_max and queue_max must be >= 1")
        if lock_timeout <= 0 or command_timeout <= 0:
            raise ValueError("lock_timeout and command_timeout must be > 0")
        self.dsn = dsn
        self.schema = validate_schema(schema)
        self.channel = channel if channel is not None else f"{schema}_events"
        self.pool_size = pool_size
        self.migrate = migrate
        self.batch_max = batch_max
        self.queue_max = queue_max
        self.lock_timeout = lock_timeout
        self.command_timeout = command_timeout
        self.blobs = blobs if blobs is not None else PostgresBlobStore(self._get_pool, schema)
        self._sql = _Sql(schema)
        self._lock = f"SET LOCAL lock_timeout = {int(lock_timeout * 1000)}; {self._sql.lock}"
        self._pool: Pool | None = None
        self._queue: asyncio.Queue[_Request | _Stop] | None = None
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._stopping = False
        self._putting = 0  # appends waiting for room in the queue
        self._closing: asyncio.Future[None] | None = None
        self._last_timestamp = 0

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> PostgresEventStore:
        """A store for ``postgresql://user@host:port/db?schema=NAME&pool_size=N``.

        ``schema`` and ``pool_size`` are the store's; every other parameter goes to asyncpg.
        Raises :class:`BadRequest` for a malformed URL or option.
        """
        dsn, options = parse_url(url)
        if "schema" in options:
            kwargs.setdefault("schema", validate_schema(options["schema"]))
        if "pool_size" in options:
            size = options["pool_size"]
            if not size.isdigit() or int(size) < 1:
                raise BadRequest("pool_size must be an integer >= 1", field="store")
            kwargs.setdefault("pool_size", int(size))
        return cls(dsn, **kwargs)

    def __repr__(self) -> str:
        # The DSN may carry a password: never shown.
        return f"PostgresEventStore(schema={self.schema!r})"

    # -- lifecycle --------------------------------------------------------------------------

    def _get_pool(self) -> Pool:
        pool = self._pool
        if pool is None:
            raise Unavailable("the store is not open")
        return pool

    async def open(self) -> None:
        """Connect, create or migrate the schema, start the writer. Idempotent while open.

        Raises :class:`Unavailable` if the database is unreachable, and
        :class:`hub.log.migrations.SchemaVersionError` (an ``Unavailable``) if the schema is
        newer than this code, or older and ``migrate`` is false.
        """
        if self._task is not None:
            return
        pool: Pool | None = None
        try:
            pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.pool_size,
                command_timeout=self.command_timeout,
            )
            async with pool.acquire() as conn:
                if self.migrate:
                    await migrate(conn, self.schema)
                else:
                    await check_version(conn, self.schema)
        except BaseException as e:
            if pool is not None:
                pool.terminate()
            if isinstance(e, _DRIVER_ERRORS):
                raise _translate(e, "opening the store") from e
            raise
        self._pool = pool
        self._queue = asyncio.Queue(maxsize=self.queue_max)
        self._accepting, self._stopping, self._closing = True, False, None
        self._task = asyncio.create_task(self._run_writer(), name=f"agora-writer:{self.schema}")

    async def migrate_schema(self) -> tuple[int, int]:
        """Create or migrate the schema without opening the store; return the versions
        (before, after). Idempotent (``agora db migrate``). Raises :class:`Unavailable`, or
        :class:`hub.log.migrations.SchemaVersionError` if the schema is newer than this code.
        """
        try:
            conn = await asyncpg.connect(self.dsn, command_timeout=self.command_timeout)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "connecting") from e
        try:
            return await migrate(conn, self.schema)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "migrating the schema") from e
        finally:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await conn.close(timeout=self.command_timeout)

    async def close(self) -> None:
        """Stop taking appends, commit every pending one, then release every connection.

        Idempotent; concurrent calls all wait for the same shutdown.
        """
        if self._task is None:
            return
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown())
        # Shielded: a caller cancelled while closing must not leave the store half closed.
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        task, queue = self._task, self._queue
        assert task is not None and queue is not None
        self._accepting = False
        self._stopping = True
        self._wake_writer()
        try:
            await task
        except asyncio.CancelledError:
            pass  # the writer was cancelled (loop teardown); pending requests were failed
        finally:
            self._fail_queued(queue)
            pool, self._pool = self._pool, None
            if pool is not None:
                try:
                    async with asyncio.timeout(self.command_timeout):
                        await pool.close()  # waits for readers to give their connections back
                except (TimeoutError, *_DRIVER_ERRORS):
                    pool.terminate()
            self._task = self._queue = None

    def _wake_writer(self) -> None:
        if self._queue is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_STOP)

    @staticmethod
    def _fail_queued(queue: asyncio.Queue[_Request | _Stop]) -> None:
        while not queue.empty():
            item = queue.get_nowait()
            if not isinstance(item, _Stop) and not item.future.done():
                item.future.set_exception(Unavailable("the store closed before this append"))

    # -- following other nodes --------------------------------------------------------------

    async def follow(
        self, notify: Callable[[str, int], None], *, resumed: Callable[[], None]
    ) -> None:
        """See :meth:`EventStore.follow`: LISTEN on :attr:`channel` over a dedicated
        connection (not one of the pool's, so a busy pool never delays the hints).

        Every ``FOLLOW_KEEPALIVE_S`` the connection is checked with a query; a lost one is
        reopened with exponential backoff (``FOLLOW_BACKOFF_S``), and ``resumed()`` is called
        once LISTEN is active again (so nothing committed after that can be missed). Runs
        until cancelled; never raises a database error.
        """
        backoff = FOLLOW_BACKOFF_S[0]

        def hint(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            workspace, sep, seq = str(payload).rpartition(":")
            if sep and seq.isdigit():
                notify(workspace, int(seq))

        while True:
            conn: asyncpg.Connection[asyncpg.Record] | None = None
            try:
                conn = await asyncpg.connect(
                    self.dsn,
                    timeout=self.command_timeout,
                    command_timeout=self.command_timeout,
                    server_settings={"application_name": f"agora-follow:{self.schema}"},
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(self.channel, hint)
                backoff = FOLLOW_BACKOFF_S[0]
                resumed()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(FOLLOW_KEEPALIVE_S):
                            await lost.wait()
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1", timeout=FOLLOW_KEEPALIVE_S)
                log.warning("LISTEN %s: connection closed; reconnecting", self.channel)
            except _DRIVER_ERRORS as e:
                log.warning(
                    "LISTEN %s: %s; reconnecting in %.1fs",
                    self.channel,
                    _translate(e, "following the log").message,
                    backoff,
                )
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, FOLLOW_BACKOFF_S[1])

    # -- the writer task --------------------------------------------------------------------

    async def _run_writer(self) -> None:
        queue = self._queue
        assert queue is not None
        carry: _Request | None = None
        try:
            while True:
                if carry is not None:
                    first: _Request | _Stop = carry
                    carry = None
                else:
                    if self._stopping and queue.empty() and self._putting == 0:
                        return
                    first = await queue.get()
                if isinstance(first, _Stop):
                    continue
                batch = [first]
                size = first.size
                # Drain whatever else is queued: that is the group in group commit.
                while size < self.batch_max and not queue.empty():
                    item = queue.get_nowait()
                    if isinstance(item, _Stop):
                        continue
                    if size + item.size > self.batch_max:
                        carry = item
                        break
                    batch.append(item)
                    size += item.size
                await self._commit(batch)
        except BaseException:
            self._accepting = False
            if carry is not None and not carry.future.done():
                carry.future.set_exception(Unavailable("the store's writer stopped"))
            self._fail_queued(queue)
            raise

    async def _commit(self, batch: list[_Request]) -> None:
        # Requests whose caller gave up before the transaction began are not written.
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        transaction = asyncio.ensure_future(self._transact(live))
        try:
            outcomes = await asyncio.shield(transaction)
        except asyncio.CancelledError:
            # A transaction under way is finished, not abandoned mid-COMMIT: report its real
            # outcome to the callers before letting the cancellation through.
            outcomes = await transaction
            _resolve(live, outcomes)
            raise
        _resolve(live, outcomes)

    async def _transact(self, batch: list[_Request]) -> list[_Outcome]:
        """Write one batch in one transaction; one outcome per request, in order."""
        try:
            pool = self._get_pool()
            async with pool.acquire() as conn, conn.transaction(isolation="read_committed"):
                await conn.execute(self._lock)
                outcomes, rows, staged, now = await self._decide(conn, batch)
                if rows:
                    await self._write(conn, rows, staged)
        except _DRIVER_ERRORS as e:
            error = _translate(e, "committing a batch")
            message = f"could not commit the batch: {error.message}"
            return [_chain(type(error)(message, **error.details), e) for _ in batch]
        except AgoraError as e:
            return [e for _ in batch]
        except Exception as e:  # a bug: fail this batch only, keep the writer alive
            return [_chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
        self._last_timestamp = max(self._last_timestamp, now)
        return outcomes

    async def _write(self, conn: Conn, rows: _Rows, staged: dict[str, _Tip]) -> None:
        workspaces = list(staged)
        tips = [staged[w] for w in workspaces]
        await conn.fetchval(
            self._sql.write,
            *rows.columns(),
            workspaces,
            [t[0] for t in tips],
            [t[1] for t in tips],
            [t[2] for t in tips],
            [t[3] for t in tips],
            self.channel,
            [f"{w}:{t[0]}" for w, t in zip(workspaces, tips, strict=True)],
        )

    async def _decide(
        self, conn: Conn, batch: list[_Request]
    ) -> tuple[list[_Outcome], _Rows, dict[str, _Tip], int]:
        """Check and seal every request of the batch in memory (holding the lock)."""
        found = await conn.fetch(self._sql.tips, sorted({r.workspace for r in batch}))
        position = int(found[0]["last"]) + 1
        tips: dict[str, _Tip] = {
            r["workspace"]: (r["seq"], r["hash"], r["position"], r["timestamp"])
            for r in found
            if r["workspace"] is not None
        }
        known = await self._known_ids(conn, batch)
        # As in the SQLite store: this node's timestamps never step back, whatever its wall
        # clock does. (Nodes' clocks may differ; ``seq`` and ``position`` carry the order.)
        now = max(time.time_ns() // 1_000_000, self._last_timestamp)
        staged: dict[str, _Tip] = {}
        written: dict[tuple[str, str], Event] = {}
        rows = _Rows()
        outcomes: list[_Outcome] = []
        for req in batch:
            tip = staged.get(req.workspace) or tips.get(req.workspace) or _EMPTY_TIP
            try:
                if isinstance(req, _Append):
                    result, position = await self._append_one(
                        conn, req, tip, staged, written, known, rows, position, now
                    )
                    outcomes.append(result)
                else:
                    outcomes.append(self._import_one(req, tip, staged, rows, position))
                    position += req.size
            except AgoraError as e:
                outcomes.append(e)
        return outcomes, rows, staged, now

    async def _known_ids(self, conn: Conn, batch: list[_Request]) -> set[tuple[str, str]]:
        """Client-chosen ids of this batch that are already stored, as (workspace, id)."""
        workspaces: list[str] = []
        ids: list[str] = []
        for req in batch:
            if isinstance(req, _Append):
                for id_ in req.client_ids:
                    workspaces.append(req.workspace)
                    ids.append(id_)
        if not ids:
            return set()
        rows = await conn.fetch(self._sql.known_ids, workspaces, ids)
        return {(r["workspace"], r["id"]) for r in rows}

    async def _append_one(
        self,
        conn: Conn,
        req: _Append,
        tip: _Tip,
        staged: dict[str, _Tip],
        written: dict[tuple[str, str], Event],
        known: set[tuple[str, str]],
        rows: _Rows,
        position: int,
        now: int,
    ) -> tuple[AppendResult, int]:
        workspace = req.workspace
        if req.client_ids:
            seen = [
                i for i in req.client_ids if (workspace, i) in written or (workspace, i) in known
            ]
            if seen:
                if len(seen) == req.size:
                    return await self._originals(conn, req, written), position
                raise Conflict(
                    f"the batch mixes {len(seen)} id(s) already written with new events",
                    head=tip[0],
                    ids=seen,
                )
        seq, prev, _, _ = tip
        if req.expected_seq is not None and req.expected_seq != seq:
            raise Conflict(
                f"expected seq {req.expected_seq} but the head of {workspace!r} is {seq}",
                head=seq,
                expected=req.expected_seq,
            )
        sealed: list[Event] = []
        bodies: list[bytes] = []
        try:
            for draft in req.drafts:
                seq += 1
                event = seal(
                    draft,
                    id=draft.id or str(uuid.uuid4()),
                    workspace=workspace,
                    seq=seq,
                    position=position,
                    timestamp=now,
                    producer=draft.producer,
                    prev=prev,
                )
                bodies.append(encode_event(event))  # fails here, before anything is staged
                prev = event.hash or GENESIS
                sealed.append(event)
                position += 1
        except (TypeError, ValueError, msgspec.EncodeError) as e:
            index = len(sealed)
            raise BadRequest(f"event {index} cannot be encoded: {e}", index=index) from e
        for event, body in zip(sealed, bodies, strict=True):
            rows.add(event, body)
            written[(workspace, event.id)] = event
        staged[workspace] = (seq, prev, position - 1, now)
        return AppendResult(workspace=workspace, events=tuple(sealed)), position

    async def _originals(
        self, conn: Conn, req: _Append, written: dict[tuple[str, str], Event]
    ) -> AppendResult:
        """The stored events of a retried batch, in the batch's order."""
        workspace = req.workspace
        found = {i: written[(workspace, i)] for i in req.client_ids if (workspace, i) in written}
        missing = [i for i in req.client_ids if i not in found]
        if missing:
            stored = await conn.fetch(self._sql.bodies_by_id, workspace, missing)
            for event in _decode_page([r[1] for r in stored], [r[0] for r in stored], "seq"):
                found[event.id] = event
        return AppendResult(
            workspace=workspace,
            events=tuple(found[i] for i in req.client_ids),
            duplicate=True,
        )

    @staticmethod
    def _import_one(
        req: _Import, tip: _Tip, staged: dict[str, _Tip], rows: _Rows, position: int
    ) -> int:
        workspace = req.workspace
        if tip[0] != 0:
            raise Conflict(
                f"workspace {workspace!r} is not empty (head {tip[0]}); import needs an empty one",
                head=tip[0],
            )
        for event in req.events:
            # Positions belong to this store; everything hashed stays verbatim.
            stored = msgspec.structs.replace(event, position=position)
            rows.add(stored, encode_event(stored))
            position += 1
        last = req.events[-1]
        staged[workspace] = (last.seq, last.hash or GENESIS, position - 1, last.timestamp)
        return len(req.events)

    # -- writing ----------------------------------------------------------------------------

    async def append(
        self, workspace: str, drafts: Sequence[Event], *, expected_seq: int | None = None
    ) -> AppendResult:
        """See :meth:`EventStore.append`. Also raises :class:`Unavailable` when the store is
        not open or the batch could not be committed (then nothing of it was written).

        A caller cancelled while waiting may still see its batch committed (the retry with
        the same ids then answers ``duplicate``).
        """
        if not self._accepting:
            raise Unavailable("the store is not open")
        validate_workspace(workspace)
        if not drafts:
            raise BadRequest("an append needs at least one event", field="events")
        if expected_seq is not None and (type(expected_seq) is not int or expected_seq < 0):
            raise BadRequest("expectedSeq must be an integer >= 0", field="expectedSeq")
        client_ids: list[str] = []
        for draft in drafts:
            if type(draft) not in _KINDS_BY_TYPE:
                raise BadRequest(f"not an event of a known kind: {type(draft).__name__}")
            if draft.id:
                if not _storable(draft.id):
                    raise BadRequest("an event id must be UTF-8 text without NUL", field="id")
                client_ids.append(draft.id)
        if len(set(client_ids)) != len(client_ids):
            raise BadRequest("an id is repeated within the batch", field="id")
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        await self._enqueue(_Append(workspace, tuple(drafts), expected_seq, client_ids, future))
        return await future

    async def import_events(self, workspace: str, events: Sequence[Event]) -> int:
        """See :meth:`EventStore.import_events`.

        ``events`` must be the whole log of ``workspace`` from seq 1, with every event's
        ``workspace`` equal to ``workspace`` (an export is restored under its own name).
        Raises :class:`BadRequest` otherwise, :class:`IntegrityError` naming the first bad
        seq, :class:`Conflict` if the workspace already has events.
        """
        if not self._accepting:
            raise Unavailable("the store is not open")
        validate_workspace(workspace)
        if not events:
            return 0
        ids: set[str] = set()
        for event in events:
            if type(event) not in _KINDS_BY_TYPE:
                raise BadRequest(f"not an event of a known kind: {type(event).__name__}")
            if event.workspace != workspace:
                raise BadRequest(
                    f"event seq {event.seq} belongs to {event.workspace!r}, not {workspace!r}",
                    field="workspace",
                    seq=event.seq,
                )
            if not event.id or event.id in ids:
                raise BadRequest(
                    f"event seq {event.seq} has a missing or repeated id", seq=event.seq
                )
            if not _storable(event.id):
                raise BadRequest(
                    f"event seq {event.seq}: an event id must be UTF-8 text without NUL",
                    field="id",
                    seq=event.seq,
                )
            ids.add(event.id)
        batch = tuple(events)
        # Hashing a large export is CPU work; keep it off the event loop.
        _, problem = await asyncio.to_thread(verify_chain, batch)
        if problem is not None:
            raise IntegrityError(
                f"chain broken at seq {problem.seq}: {problem.problem}",
                seq=problem.seq,
                problem=problem.problem,
            )
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._enqueue(_Import(workspace, batch, future))
        return await future

    async def _enqueue(self, request: _Request) -> None:
        queue = self._queue
        assert queue is not None
        try:
            queue.put_nowait(request)
            return
        except asyncio.QueueFull:
            pass
        # Backpressure: wait for room. The writer does not exit while someone waits here.
        self._putting += 1
        try:
            await queue.put(request)
        finally:
            self._putting -= 1
            if self._stopping and self._putting == 0:
                self._wake_writer()

    # -- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store (or replace) a snapshot. Raises :class:`Unavailable`."""
        await self._execute(
            self._sql.save_snapshot,
            (snapshot.workspace, snapshot.name, snapshot.version, snapshot.seq, snapshot.body),
            "saving a snapshot",
        )

    async def delete_snapshots(self, workspace: str | None = None) -> int:
        """Delete one workspace's snapshots, or all; return how many. Raises ``Unavailable``."""
        if workspace is None:
            status = await self._execute(self._sql.delete_all_snapshots, (), "deleting snapshots")
        else:
            status = await self._execute(
                self._sql.delete_snapshots, (workspace,), "deleting snapshots"
            )
        return _rowcount(status)

    async def load_snapshot(
        self, workspace: str, name: str, version: int, *, at_or_before: int | None = None
    ) -> Snapshot | None:
        """See :meth:`EventStore.load_snapshot`. Raises :class:`Unavailable`."""
        limit = _MAX_SEQ if at_or_before is None else at_or_before
        rows = await self._fetch(
            self._sql.load_snapshot, (workspace, name, version, limit), "loading a snapshot"
        )
        if not rows:
            return None
        seq, body = rows[0]
        return Snapshot(workspace=workspace, name=name, version=version, seq=seq, body=bytes(body))

    # -- reading ----------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any], doing: str) -> list[asyncpg.Record]:
        pool = self._get_pool()
        try:
            return list(await pool.fetch(sql, *params))
        except _DRIVER_ERRORS as e:
            raise _translate(e, doing) from e

    async def _execute(self, sql: str, params: Sequence[Any], doing: str) -> str:
        pool = self._get_pool()
        try:
            return await pool.execute(sql, *params)
        except _DRIVER_ERRORS as e:
            raise _translate(e, doing) from e

    async def read_batch(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """See :meth:`EventStore.read_batch`. Raises ``IntegrityError`` for an undecodable
        row, ``Unavailable`` on a database error."""
        if limit <= 0 or not _storable(workspace):
            return []
        until = _MAX_SEQ if until_seq is None else until_seq
        rows = await self._fetch(
            self._sql.range, (workspace, after_seq, until, limit), "reading events"
        )
        return _decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")

    async def read_raw(
        self, workspace: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes]]:
        """See :meth:`EventStore.read_raw`. Raises ``Unavailable``."""
        if limit <= 0 or not _storable(workspace):
            return []
        rows = await self._fetch(
            self._sql.range, (workspace, after_seq, _MAX_SEQ, limit), "reading events"
        )
        return [(seq, bytes(body)) for seq, body in rows]

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Event]:
        """See :meth:`EventStore.read_all`. Raises ``IntegrityError``, ``Unavailable``."""
        if limit <= 0:
            return []
        rows = await self._fetch(self._sql.all, (after_position, limit), "reading events")
        return _decode_page([r[1] for r in rows], [r[0] for r in rows], "position")

    async def lookup_ids(self, workspace: str, ids: Sequence[str]) -> dict[str, Event]:
        """See :meth:`EventStore.lookup_ids`. Raises ``IntegrityError``, ``Unavailable``."""
        wanted = [i for i in ids if _storable(i)]
        if not wanted or not _storable(workspace):
            return {}
        rows = await self._fetch(self._sql.bodies_by_id, (workspace, wanted), "looking up ids")
        events = _decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")
        return {e.id: e for e in events}

    async def head(self, workspace: str) -> Head | None:
        """See :meth:`EventStore.head`. Raises ``Unavailable``."""
        if not _storable(workspace):
            return None
        rows = await self._fetch(self._sql.head, (workspace,), "reading a head")
        return _head(rows[0]) if rows else None

    async def heads(self) -> list[Head]:
        """See :meth:`EventStore.heads` (ordered by workspace name, bytewise). Raises
        ``Unavailable``."""
        return [_head(r) for r in await self._fetch(self._sql.heads, (), "reading heads")]

    async def verify(self, workspace: str) -> VerifyReport:
        """See :meth:`EventStore.verify`; checks a page at a time."""
        checked = 0
        prev = GENESIS
        last = 0
        async for page in self._pages(workspace, batch=5000):
            n, problem = verify_chain(page, after_seq=last, prev=prev)
            checked += n
            if problem is not None:
                head = page[n - 1].seq if n else last
                return VerifyReport(workspace=workspace, checked=checked, head=head, error=problem)
            prev = page[-1].hash or GENESIS
            last = page[-1].seq
        return VerifyReport(workspace=workspace, checked=checked, head=last)

    async def _pages(self, workspace: str, *, batch: int) -> AsyncIterator[list[Event]]:
        after = 0
        while True:
            page = await self.read_batch(workspace, after_seq=after, limit=batch)
            if page:
                yield page
            if len(page) < batch:
                return
            after = page[-1].seq


def _head(row: asyncpg.Record) -> Head:
    return Head(
        workspace=row["workspace"],
        seq=row["seq"],
        hash=row["hash"],
        timestamp=row["timestamp"],
        position=row["position"],
    )


def _resolve(batch: list[_Request], outcomes: list[_Outcome]) -> None:
    for request, outcome in zip(batch, outcomes, strict=True):
        future = request.future
        if future.done():  # the caller was cancelled
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
