"""The embedded log store: SQLite in WAL mode with one writer and group commit.

Why this shape (ARCHITECTURE.md, "Storage and scale"):

* **One writer, group commit.** ``append`` only enqueues a request on a bounded queue and awaits
  its future. One writer task, owned by the store, drains every queued request (up to
  ``batch_max`` events) and writes the whole batch in ONE hop to a dedicated single-thread
  executor that owns the writing ``sqlite3`` connection: ``BEGIN IMMEDIATE``, per request
  dedup / ``expected_seq`` check / seal, one ``executemany``, ``COMMIT``. One fsync then covers
  every request in the batch, which is where the throughput under concurrency comes from.
  Nothing is acknowledged before ``COMMIT`` returns (``synchronous=FULL``).
* **Checks before inserts.** Every request is checked and sealed in memory first; only accepted
  requests contribute rows, so one failing request never fails the others of its batch. If the
  transaction itself fails (an I/O error), it is rolled back, the cached heads are dropped and
  every request of the batch fails with :class:`hub.errors.Unavailable`.
* **Readers never wait for the writer.** Reads go through a separate ``aiosqlite`` connection
  (``query_only``); WAL lets it read the last committed state while a batch is being written.
* **The body is the truth.** ``body`` holds ``encode_event`` of the full sealed event; the other
  columns are indexes. A page is read as ONE value (SQLite concatenates the bodies) and decoded
  in one ``msgspec`` call over ``[body,body,…]``.
* **Minted ids are time-ordered** (UUIDv7, :func:`mint_ids`), so the ``(workspace, id)`` index
  grows at its tail instead of dirtying a random page per event (see ``mint_ids``).
* **Imports** restore the whole exported log of one workspace, under the same workspace name,
  into an empty workspace; positions are re-assigned, everything hashed is kept.

One store instance owns a database file. Should another connection commit to it anyway, the
writer notices (``PRAGMA data_version``) and reloads its cached heads before deciding anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeAlias

import aiosqlite
import msgspec

from hub.chain import GENESIS, seal, verify_chain
from hub.errors import (
    AgoraError,
    BadRequest,
    Conflict,
    IntegrityError,
    Internal,
    Unavailable,
)
from hub.events import EVENT_TYPES, Event, decode_event, decode_events, encode_event
from hub.log.base import AppendResult, EventStore, Head, Snapshot, VerifyReport
from hub.log.blobs import FileBlobStore
from hub.validation import validate_workspace

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = (
    """
    CREATE TABLE IF NOT EXISTS events (
        position  INTEGER PRIMARY KEY,
        workspace TEXT    NOT NULL,
        seq       INTEGER NOT NULL,
        id        TEXT    NOT NULL,
        kind      TEXT    NOT NULL,
        timestamp INTEGER NOT NULL,
        hash      TEXT    NOT NULL,
        body      BLOB    NOT NULL,
        UNIQUE (workspace, seq),
        UNIQUE (workspace, id)
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS snapshots (
        workspace TEXT    NOT NULL,
        name      TEXT    NOT NULL,
        version   INTEGER NOT NULL,
        seq       INTEGER NOT NULL,
        body      BLOB    NOT NULL,
        PRIMARY KEY (workspace, name, version, seq)
    ) WITHOUT ROWID
    """,
)

_INSERT: Final = (
    "INSERT INTO events (position, workspace, seq, id, kind, timestamp, hash, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# Ids travel as one JSON array parameter so the statement text (and its prepared form) is
# the same whatever the number of ids.
_SELECT_IDS: Final = (
    "SELECT id, seq FROM events WHERE workspace = ? AND id IN (SELECT value FROM json_each(?))"
)
_SELECT_BODIES_BY_ID: Final = (
    "SELECT seq, body FROM events WHERE workspace = ? "
    "AND id IN (SELECT value FROM json_each(?)) ORDER BY seq"
)
_SELECT_TIP: Final = (
    "SELECT seq, hash, position FROM events WHERE workspace = ? ORDER BY seq DESC LIMIT 1"
)
_SELECT_HEAD: Final = (
    "SELECT workspace, seq, hash, timestamp, position FROM events "
    "WHERE workspace = ? ORDER BY seq DESC LIMIT 1"
)
# Every workspace's last event without scanning the log: a recursive skip-scan over the
# (workspace, seq) index, one index probe per workspace.
_SELECT_HEADS: Final = """
    WITH RECURSIVE ws(name) AS (
        SELECT MIN(workspace) FROM events
        UNION ALL
        SELECT (SELECT MIN(workspace) FROM events WHERE workspace > ws.name)
        FROM ws WHERE ws.name IS NOT NULL
    )
    SELECT e.workspace, e.seq, e.hash, e.timestamp, e.position
    FROM ws JOIN events AS e
      ON e.workspace = ws.name
     AND e.seq = (SELECT MAX(seq) FROM events WHERE workspace = ws.name)
    ORDER BY e.workspace
"""
_SELECT_RANGE: Final = (
    "SELECT seq, body FROM events WHERE workspace = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?"
)
# The fast path of replays: SQLite concatenates a page of bodies into one JSON array body
# (no Python object per row; the GIL is released for the whole query) and msgspec decodes it
# in one call. The subquery runs as an ordered co-routine; the order and the count are still
# checked after decoding, and any surprise falls back to the row-wise query.
_CONCAT_RANGE: Final = (
    "SELECT CAST(group_concat(body, ',') AS BLOB), count(*) FROM ("
    "SELECT body FROM events WHERE workspace = ? AND seq > ? AND seq <= ? "
    "ORDER BY seq LIMIT ?)"
)
_CONCAT_ALL: Final = (
    "SELECT CAST(group_concat(body, ',') AS BLOB), count(*) FROM ("
    "SELECT body FROM events WHERE position > ? ORDER BY position LIMIT ?)"
)
_SELECT_ALL: Final = (
    "SELECT position, body FROM events WHERE position > ? ORDER BY position LIMIT ?"
)
_SELECT_SNAPSHOT: Final = (
    "SELECT seq, body FROM snapshots WHERE workspace = ? AND name = ? AND version = ? "
    "AND seq <= ? ORDER BY seq DESC LIMIT 1"
)

_MAX_SEQ: Final = 2**63 - 1
_KINDS_BY_TYPE: Final[dict[type[Event], str]] = {t: t.kind for t in EVENT_TYPES}
DEFAULT_QUEUE_MAX: Final = 4096
_MAX_CACHED_HEADS: Final = 100_000
DEFAULT_BUSY_TIMEOUT_S: Final = 5.0
# Bound the WAL file left behind after a checkpoint (it is otherwise never truncated).
_JOURNAL_SIZE_LIMIT: Final = 64 * 1024 * 1024
# Checkpoint every ~16 MB of WAL instead of SQLite's 4 MB: a group commit dirties many pages,
# and a longer interval copies each hot page (index tails) back once per checkpoint rather
# than several times. Measured gain under 64 writers: 0-30%, noisy on a shared VM.
_WAL_AUTOCHECKPOINT_PAGES: Final = 4000
_json: Final = msgspec.json.Encoder()

# (seq, hash, position) of a workspace's last event; (0, "", 0) for an empty workspace.
_Tip: TypeAlias = tuple[int, str, int]
_EMPTY_TIP: Final[_Tip] = (0, GENESIS, 0)
_Row: TypeAlias = tuple[int, str, int, str, str, int, str, bytes]


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


def mint_ids(timestamp_ms: int, count: int) -> list[str]:
    """``count`` new event ids: time-ordered UUIDs (version 7, RFC 9562) for ``timestamp_ms``.

    Why not uuid4: ids are indexed (``UNIQUE(workspace, id)``). Random ids land on a random
    index leaf each, so every event of a group commit dirties its own page and the commit
    writes (and fsyncs) one extra page per event; time-ordered ids land on the same few
    leaves (measured here: a third of the commit cost). 74 random bits per id keep them
    unique across hubs; one ``urandom`` call serves the whole batch.
    """
    t = f"{timestamp_ms & 0xFFFF_FFFF_FFFF:012x}"
    prefix = f"{t[:8]}-{t[8:]}-7"
    rnd = os.urandom(10 * count).hex()
    variant = _VARIANT
    return [
        f"{prefix}{r[:3]}-{variant[r[3]]}{r[4:7]}-{r[7:19]}"
        for r in (rnd[i : i + 20] for i in range(0, 20 * count, 20))
    ]


def mint_id(timestamp_ms: int) -> str:
    """One new event id (see :func:`mint_ids`)."""
    return mint_ids(timestamp_ms, 1)[0]


# The RFC 9562 variant: the top two bits of the 17th hex digit are 0b10.
_VARIANT: Final = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}


def _translate(e: sqlite3.Error, doing: str) -> AgoraError:
    """Map a driver error to the hub's taxonomy (the one place this happens for reads)."""
    name = getattr(e, "sqlite_errorname", "")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return IntegrityError(f"database is damaged while {doing}: {e}", sqlite=name)
    return Unavailable(f"database error while {doing}: {e}", sqlite=name)


def _as_bytes(body: bytes | str) -> bytes:
    # A body rewritten as TEXT (by the sqlite3 shell, say) must still reach the decoder, so
    # the hash check — not a TypeError — is what reports the tampering.
    return body if isinstance(body, bytes) else str(body).encode("utf-8", "surrogatepass")


def _decode_page(bodies: list[bytes | str], keys: Iterable[int], key_name: str) -> list[Event]:
    """Decode stored bodies in one call. Raises :class:`IntegrityError` naming a bad row."""
    if not bodies:
        return []
    raw = [_as_bytes(b) for b in bodies]
    try:
        return decode_events(b"[" + b",".join(raw) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        for key, body in zip(keys, raw, strict=True):
            try:
                decode_event(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as bad:
                raise IntegrityError(
                    f"stored event at {key_name} {key} cannot be decoded: {bad}",
                    **{key_name: key},
                ) from bad
        raise IntegrityError(f"stored events cannot be decoded: {e}") from e


class _Writer:
    """The writing side. Every method runs on the store's single writer thread."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.conn: sqlite3.Connection | None = None
        self.heads: dict[str, _Tip] = {}
        self.next_position: int | None = None  # None: reload from the database
        self.data_version: int | None = None
        self.last_timestamp = 0

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Connect, switch to WAL, create or check the schema. Raises ``Unavailable``."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # created on the loop's executor thread, used here
                cached_statements=256,
            )
        except (OSError, sqlite3.Error) as e:
            raise Unavailable(f"cannot open database {self.path}: {e}") from e
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise Unavailable(f"cannot put {self.path} in WAL mode (got {mode!r})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA journal_size_limit={_JOURNAL_SIZE_LIMIT}")
            conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise Unavailable(
                        f"{self.path} has schema version {version}; this hub knows up to "
                        f"{SCHEMA_VERSION}",
                        version=version,
                    )
                if version < SCHEMA_VERSION:
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            self.data_version = conn.execute("PRAGMA data_version").fetchone()[0]
            self.conn = conn
            self._load_position()
        except sqlite3.Error as e:
            conn.close()
            self.conn = None
            raise _translate(e, f"opening {self.path}") from e
        except BaseException:
            conn.close()
            self.conn = None
            raise

    def close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            conn.close()

    def _load_position(self) -> None:
        assert self.conn is not None
        row = self.conn.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()
        self.next_position = int(row[0]) + 1

    def _forget(self) -> None:
        """Drop everything cached; it is reloaded from the database when next needed."""
        self.heads.clear()
        self.next_position = None

    def _tip(self, workspace: str) -> _Tip:
        tip = self.heads.get(workspace)
        if tip is None:
            assert self.conn is not None
            row = self.conn.execute(_SELECT_TIP, (workspace,)).fetchone()
            tip = _EMPTY_TIP if row is None else (row[0], row[1], row[2])
            self.heads[workspace] = tip
        return tip

    # -- the batch --------------------------------------------------------------------------

    def write(self, batch: list[_Request]) -> list[_Outcome]:
        """Write one batch in one transaction; one outcome per request, in order."""
        conn = self.conn
        if conn is None:
            return [Unavailable("the store is closed") for _ in batch]
        try:
            conn.execute("BEGIN IMMEDIATE")
            outcomes, staged, rows, position, now = self._decide(conn, batch)
            if rows:
                conn.executemany(_INSERT, rows)
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._abort(conn)
            return [_chain(Unavailable(f"could not commit the batch: {e}"), e) for _ in batch]
        except Exception as e:  # a bug: fail this batch only, keep the writer alive
            self._abort(conn)
            return [_chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
        # Committed: only now do the staged heads become the truth.
        if len(self.heads) > _MAX_CACHED_HEADS:
            self.heads.clear()  # bounded: evicted heads are reloaded on demand
        self.heads.update(staged)
        self.next_position = position
        self.last_timestamp = now
        return outcomes

    def _abort(self, conn: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        self._forget()

    def _decide(
        self, conn: sqlite3.Connection, batch: list[_Request]
    ) -> tuple[list[_Outcome], dict[str, _Tip], list[_Row], int, int]:
        """Check and seal every request of the batch in memory; nothing is written yet."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self.data_version:
            # Another connection committed: our cached heads may be stale.
            self.data_version = version
            self._forget()
        if self.next_position is None:
            self._load_position()
        assert self.next_position is not None
        position = self.next_position
        now = time.time_ns() // 1_000_000
        now = max(now, self.last_timestamp)  # never step back, whatever the wall clock does
        staged: dict[str, _Tip] = {}
        written: dict[tuple[str, str], Event] = {}
        known = self._known_ids(conn, batch)
        minted = iter(
            mint_ids(now, sum(r.size - len(r.client_ids) for r in batch if isinstance(r, _Append)))
        )
        rows: list[_Row] = []
        outcomes: list[_Outcome] = []
        for req in batch:
            try:
                if isinstance(req, _Append):
                    result, position = self._append_one(
                        conn, req, staged, written, known, minted, rows, position, now
                    )
                    outcomes.append(result)
                else:
                    count, position = self._import_one(req, staged, rows, position)
                    outcomes.append(count)
            except AgoraError as e:
                outcomes.append(e)
        return outcomes, staged, rows, position, now

    def _known_ids(
        self, conn: sqlite3.Connection, batch: list[_Request]
    ) -> dict[tuple[str, str], int]:
        """Client-chosen ids of this batch that are already stored: (workspace, id) → seq."""
        by_workspace: dict[str, list[str]] = {}
        for req in batch:
            if isinstance(req, _Append) and req.client_ids:
                by_workspace.setdefault(req.workspace, []).extend(req.client_ids)
        known: dict[tuple[str, str], int] = {}
        for workspace, ids in by_workspace.items():
            tip = self.heads.get(workspace)
            if tip is not None and tip[0] == 0:
                continue  # an empty workspace holds no ids
            for id_, seq in conn.execute(_SELECT_IDS, (workspace, _json.encode(ids))):
                known[(workspace, id_)] = seq
        return known

    def _append_one(
        self,
        conn: sqlite3.Connection,
        req: _Append,
        staged: dict[str, _Tip],
        written: dict[tuple[str, str], Event],
        known: dict[tuple[str, str], int],
        minted: Iterator[str],
        rows: list[_Row],
        position: int,
        now: int,
    ) -> tuple[AppendResult, int]:
        workspace = req.workspace
        tip = staged.get(workspace) or self._tip(workspace)
        if req.client_ids:
            seen = [
                i for i in req.client_ids if (workspace, i) in written or (workspace, i) in known
            ]
            if seen:
                if len(seen) == req.size:
                    return self._originals(conn, req, written), position
                raise Conflict(
                    f"the batch mixes {len(seen)} id(s) already written with new events",
                    head=tip[0],
                    ids=seen,
                )
        seq, prev, _ = tip
        if req.expected_seq is not None and req.expected_seq != seq:
            raise Conflict(
                f"expected seq {req.expected_seq} but the head of {workspace!r} is {seq}",
                head=seq,
                expected=req.expected_seq,
            )
        sealed: list[Event] = []
        new_rows: list[_Row] = []
        try:
            for draft in req.drafts:
                seq += 1
                event = seal(
                    draft,
                    id=draft.id or next(minted),
                    workspace=workspace,
                    seq=seq,
                    position=position,
                    timestamp=now,
                    producer=draft.producer,
                    prev=prev,
                )
                prev = event.hash or GENESIS
                new_rows.append(
                    (position, workspace, seq, event.id, event.kind, now, prev, encode_event(event))
                )
                sealed.append(event)
                position += 1
        except (TypeError, ValueError, msgspec.EncodeError) as e:
            index = len(sealed)
            raise BadRequest(f"event {index} cannot be encoded: {e}", index=index) from e
        rows.extend(new_rows)
        if req.client_ids:  # minted ids are new by construction: only client ids can repeat
            for event in sealed:
                written[(workspace, event.id)] = event
        staged[workspace] = (seq, prev, position - 1)
        return AppendResult(workspace=workspace, events=tuple(sealed)), position

    def _originals(
        self, conn: sqlite3.Connection, req: _Append, written: dict[tuple[str, str], Event]
    ) -> AppendResult:
        """The stored events of a retried batch, in the batch's order."""
        workspace = req.workspace
        found = {i: written[(workspace, i)] for i in req.client_ids if (workspace, i) in written}
        missing = [i for i in req.client_ids if i not in found]
        if missing:
            rows = conn.execute(_SELECT_BODIES_BY_ID, (workspace, _json.encode(missing))).fetchall()
            for event in _decode_page([r[1] for r in rows], [r[0] for r in rows], "seq"):
                found[event.id] = event
        return AppendResult(
            workspace=workspace,
            events=tuple(found[i] for i in req.client_ids),
            duplicate=True,
        )

    def _import_one(
        self, req: _Import, staged: dict[str, _Tip], rows: list[_Row], position: int
    ) -> tuple[int, int]:
        workspace = req.workspace
        tip = staged.get(workspace) or self._tip(workspace)
        if tip[0] != 0:
            raise Conflict(
                f"workspace {workspace!r} is not empty (head {tip[0]}); import needs an empty one",
                head=tip[0],
            )
        new_rows: list[_Row] = []
        for event in req.events:
            # Positions belong to this store; everything hashed stays verbatim.
            stored = msgspec.structs.replace(event, position=position)
            new_rows.append(
                (
                    position,
                    workspace,
                    event.seq,
                    event.id,
                    event.kind,
                    event.timestamp,
                    event.hash or GENESIS,
                    encode_event(stored),
                )
            )
            position += 1
        rows.extend(new_rows)
        last = req.events[-1]
        staged[workspace] = (last.seq, last.hash or GENESIS, position - 1)
        return len(req.events), position

    # -- snapshots (writes share the writer thread, so they never contend for the lock) -----

    def save_snapshot(self, snapshot: Snapshot) -> None:
        self._in_transaction(
            "INSERT OR REPLACE INTO snapshots (workspace, name, version, seq, body) "
            "VALUES (?, ?, ?, ?, ?)",
            (snapshot.workspace, snapshot.name, snapshot.version, snapshot.seq, snapshot.body),
            "saving a snapshot",
        )

    def delete_snapshots(self, workspace: str | None) -> int:
        if workspace is None:
            return self._in_transaction("DELETE FROM snapshots", (), "deleting snapshots")
        return self._in_transaction(
            "DELETE FROM snapshots WHERE workspace = ?", (workspace,), "deleting snapshots"
        )

    def _in_transaction(self, sql: str, params: tuple[Any, ...], doing: str) -> int:
        conn = self.conn
        if conn is None:
            raise Unavailable("the store is closed")
        try:
            conn.execute("BEGIN IMMEDIATE")
            count = conn.execute(sql, params).rowcount
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            raise _translate(e, doing) from e
        return int(count)


def _chain(error: AgoraError, cause: BaseException) -> AgoraError:
    """``raise error from cause`` for an error handed to another thread's future."""
    error.__cause__ = cause
    return error


class SqliteEventStore(EventStore):
    """The SQLite :class:`EventStore` (see the module docstring for the design).

    ``path``: the database file (its directory is created). ``blobs_dir``: where the
    :class:`FileBlobStore` keeps blobs (default ``<path's directory>/blobs``). ``batch_max``:
    the most events one group commit writes (a larger single request is written alone).
    ``queue_max``: the most requests waiting for the writer; ``append`` then waits for room.
    ``busy_timeout``: seconds to wait for a lock held by another process.
    """

    def __init__(
        self,
        path: Path,
        *,
        blobs_dir: Path | None = None,
        batch_max: int = 1024,
        queue_max: int = DEFAULT_QUEUE_MAX,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if batch_max < 1 or queue_max < 1:
            raise ValueError("batch_max and queue_max must be >= 1")
        self.path = Path(path)
        self.batch_max = batch_max
        self.queue_max = queue_max
        self.busy_timeout = busy_timeout
        self.blob_root = blobs_dir if blobs_dir is not None else self.path.parent / "blobs"
        self.blobs = FileBlobStore(self.blob_root)
        self._writer: _Writer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._reader: aiosqlite.Connection | None = None
        self._queue: asyncio.Queue[_Request | _Stop] | None = None
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._stopping = False
        self._putting = 0  # appends waiting for room in the queue
        self._closing: asyncio.Future[None] | None = None
        self._opening = asyncio.Lock()

    def __repr__(self) -> str:
        return f"SqliteEventStore({str(self.path)!r})"

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open (or create) the database and start the writer. Idempotent while open.

        Raises :class:`Unavailable` if the file cannot be opened or has a newer schema.
        """
        async with self._opening:
            if self._task is None:
                await self._open()

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agora-sqlite-writer")
        writer = _Writer(self.path, self.busy_timeout)
        reader: aiosqlite.Connection | None = None
        try:
            await loop.run_in_executor(executor, writer.open)
            await asyncio.to_thread(self.blob_root.mkdir, parents=True, exist_ok=True)
            reader = await aiosqlite.connect(self.path, isolation_level=None)
            await reader.execute("PRAGMA query_only=1")
            await reader.execute("PRAGMA cache_size=-32768")  # 32 MiB for replays
        except BaseException as e:
            if reader is not None:
                await reader.close()
            await loop.run_in_executor(executor, writer.close)
            executor.shutdown(wait=False)
            if isinstance(e, sqlite3.Error):
                raise _translate(e, f"opening {self.path}") from e
            if isinstance(e, OSError):
                raise Unavailable(f"cannot open {self.path}: {e}") from e
            raise
        self._writer, self._executor, self._reader = writer, executor, reader
        self._queue = asyncio.Queue(maxsize=self.queue_max)
        self._accepting, self._stopping, self._closing = True, False, None
        self._task = asyncio.create_task(self._run_writer(), name=f"agora-writer:{self.path}")

    async def close(self) -> None:
        """Stop taking appends, commit every pending one, then release everything.

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
            loop = asyncio.get_running_loop()
            if self._reader is not None:
                with contextlib.suppress(sqlite3.Error, ValueError):
                    await self._reader.close()
            if self._writer is not None and self._executor is not None:
                # Runs after any hop still in flight (one thread, FIFO).
                await loop.run_in_executor(self._executor, self._writer.close)
                self._executor.shutdown(wait=False)
            self._reader = self._writer = self._executor = None
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
        """Write ``batch`` in one hop to the writer thread and settle its callers' futures.

        The thread hands the outcomes back with one ``call_soon_threadsafe`` that settles
        every future directly (one loop iteration, no chain of wrapped futures). If this
        task is cancelled meanwhile, the transaction still finishes on the thread (it cannot
        be interrupted) and its real outcome still reaches the callers.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        writer = self._writer
        assert writer is not None and self._executor is not None

        def report(outcomes: list[_Outcome]) -> None:  # on the loop
            _resolve(batch, outcomes)
            if not done.done():
                done.set_result(None)

        def job() -> None:  # on the writer thread
            try:
                outcomes = writer.write(batch)
            except BaseException as e:  # write() catches errors; this is the last resort
                outcomes = [_chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
            # A closed loop means nobody is left to tell; the batch's outcome stands.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(report, outcomes)

        self._executor.submit(job)
        await done

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
                client_ids.append(draft.id)
        if len(set(client_ids)) != len(client_ids):
            raise BadRequest("an id is repeated within the batch", field="id")
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        request = _Append(workspace, tuple(drafts), expected_seq, client_ids, future)
        queue = self._queue
        assert queue is not None
        try:
            queue.put_nowait(request)  # the common case, without a coroutine of its own
        except asyncio.QueueFull:
            await self._enqueue(request)
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
        task = self._task
        if task is None or task.done():
            # The writer died while we waited (it never exits while anyone waits here on a
            # normal close): nobody will drain the queue, so fail what is in it, ours included.
            self._fail_queued(queue)

    # -- snapshots --------------------------------------------------------------------------

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store (or replace) a snapshot. Raises :class:`Unavailable`."""
        await self._on_writer(self._writer_or_raise().save_snapshot, snapshot)

    async def delete_snapshots(self, workspace: str | None = None) -> int:
        """Delete one workspace's snapshots, or all; return how many. Raises ``Unavailable``."""
        count: int = await self._on_writer(self._writer_or_raise().delete_snapshots, workspace)
        return count

    async def load_snapshot(
        self, workspace: str, name: str, version: int, *, at_or_before: int | None = None
    ) -> Snapshot | None:
        """See :meth:`EventStore.load_snapshot`. Raises :class:`Unavailable`."""
        limit = _MAX_SEQ if at_or_before is None else at_or_before
        rows = await self._fetch(
            _SELECT_SNAPSHOT, (workspace, name, version, limit), "loading a snapshot"
        )
        if not rows:
            return None
        seq, body = rows[0]
        return Snapshot(workspace=workspace, name=name, version=version, seq=seq, body=bytes(body))

    def _writer_or_raise(self) -> _Writer:
        if self._writer is None or not self._accepting:
            raise Unavailable("the store is not open")
        return self._writer

    async def _on_writer(self, fn: Any, *args: Any) -> Any:
        # A plain await (no shield): a cancelled caller just stops waiting; the job itself
        # runs to completion on the writer thread.
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- reading ----------------------------------------------------------------------------

    async def _fetch(self, sql: str, params: Sequence[Any], doing: str) -> list[Any]:
        reader = self._reader
        if reader is None:
            raise Unavailable("the store is not open")
        try:
            return list(await reader.execute_fetchall(sql, params))
        except sqlite3.Error as e:
            raise _translate(e, doing) from e
        except ValueError as e:  # aiosqlite: the connection closed under us
            raise Unavailable(f"the store closed while {doing}") from e

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
        if limit <= 0:
            return []
        until = _MAX_SEQ if until_seq is None else until_seq
        params = (workspace, after_seq, until, limit)
        page = await self._concat_page(_CONCAT_RANGE, params, "seq")
        if page is not None:
            return page
        rows = await self._fetch(_SELECT_RANGE, params, "reading events")
        return _decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")

    async def _concat_page(self, sql: str, params: tuple[Any, ...], key: str) -> list[Event] | None:
        """A page through the concatenating query, or None to use the row-wise one."""
        try:
            rows = await self._fetch(sql, params, "reading events")
        except Unavailable as e:
            if e.details.get("sqlite") == "SQLITE_TOOBIG":
                return None  # a page of huge events: fetch it row by row
            raise
        blob, count = rows[0]
        if not count:
            return []
        try:
            events = decode_events(b"[" + blob + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # the row-wise path names the damaged row
        if len(events) != count or not _increasing(events, key):
            return None
        return events

    async def read_raw(
        self, workspace: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes]]:
        """See :meth:`EventStore.read_raw`. Raises ``Unavailable``."""
        if limit <= 0:
            return []
        rows = await self._fetch(
            _SELECT_RANGE, (workspace, after_seq, _MAX_SEQ, limit), "reading events"
        )
        return [(seq, _as_bytes(body)) for seq, body in rows]

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Event]:
        """See :meth:`EventStore.read_all`. Raises ``IntegrityError``, ``Unavailable``."""
        if limit <= 0:
            return []
        page = await self._concat_page(_CONCAT_ALL, (after_position, limit), "position")
        if page is not None:
            return page
        rows = await self._fetch(_SELECT_ALL, (after_position, limit), "reading events")
        return _decode_page([r[1] for r in rows], [r[0] for r in rows], "position")

    async def lookup_ids(self, workspace: str, ids: Sequence[str]) -> dict[str, Event]:
        """See :meth:`EventStore.lookup_ids`. Raises ``IntegrityError``, ``Unavailable``."""
        if not ids:
            return {}
        rows = await self._fetch(
            _SELECT_BODIES_BY_ID, (workspace, _json.encode(list(ids))), "looking up ids"
        )
        events = _decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")
        return {e.id: e for e in events}

    async def head(self, workspace: str) -> Head | None:
        """See :meth:`EventStore.head`. Raises ``Unavailable``."""
        rows = await self._fetch(_SELECT_HEAD, (workspace,), "reading a head")
        return _head(rows[0]) if rows else None

    async def heads(self) -> list[Head]:
        """See :meth:`EventStore.heads`. Raises ``Unavailable``."""
        return [_head(r) for r in await self._fetch(_SELECT_HEADS, (), "reading heads")]

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


def _increasing(events: list[Event], key: str) -> bool:
    last = -1
    if key == "seq":
        for event in events:
            if event.seq <= last:
                return False
            last = event.seq
    else:
        for event in events:
            if event.position <= last:
                return False
            last = event.position
    return True


def _head(row: Sequence[Any]) -> Head:
    return Head(workspace=row[0], seq=row[1], hash=row[2], timestamp=row[3], position=row[4])


def _resolve(batch: list[_Request], outcomes: list[_Outcome]) -> None:
    for request, outcome in zip(batch, outcomes, strict=True):
        future = request.future
        if future.done():  # the caller was cancelled
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
