"""The embedded log store: SQLite in WAL mode with one writer and group commit.

Why this shape (ARCHITECTURE.md, "Storage and scale"):

* **One writer, group commit** (:mod:`hub.log.writer`, shared with the PostgreSQL store).
  ``append`` only enqueues a request on a bounded queue and awaits its future. One writer task,
  owned by the store, drains every queued request (up to ``batch_max`` events) and writes the
  whole batch in ONE hop to a dedicated single-thread executor that owns the writing
  ``sqlite3`` connection: ``BEGIN IMMEDIATE``, per request dedup / ``expected_seq`` check / seal
  (:func:`hub.log.writer.decide_batch`), one ``executemany``, ``COMMIT``. One fsync then covers
  every request in the batch, which is where the throughput under concurrency comes from.
  Nothing is acknowledged before ``COMMIT`` returns (``synchronous=FULL``).
* **Checks before inserts.** Every request is checked and sealed in memory first; only accepted
  requests contribute rows, so one failing request never fails the others of its batch. If the
  transaction itself fails (an I/O error), it is rolled back, the cached heads are dropped and
  every request of the batch fails with :class:`hub.core.errors.Unavailable`.
* **Heads are cached** by the writer across transactions (this store is the file's only
  writer), unlike PostgreSQL's, which reads them in each transaction. A batch is written even
  for callers cancelled while it was queued (PostgreSQL skips those): the SQLite hop is cheap
  and a retry with the same ids answers ``duplicate`` either way.
* **Readers never wait for the writer.** Reads go through a separate ``aiosqlite`` connection
  (``query_only``); WAL lets it read the last committed state while a batch is being written.
* **The body is the truth.** ``body`` holds ``encode_event`` of the full sealed event; the other
  columns are indexes. A page is read as ONE value (SQLite concatenates the bodies) and decoded
  in one ``msgspec`` call over ``[body,body,…]``.
* **Minted ids are time-ordered** (UUIDv7, :func:`hub.log.ids.mint_ids`), so the
  ``(workspace, id)`` index grows at its tail instead of dirtying a random page per event.
* **The Merkle tree lives in the event rows** (schema 3): each event's ``tree`` column holds
  the stored hashes its leaf adds (hub.core.merkle.stored_hash_leaf: the leaf's hash, then
  each subtree it completes; 64 bytes on average), written by the same ``INSERT``. The tree
  then costs a commit no row and no index entry of its own, only bytes at the table's tail,
  and a proof reads its hashes through the ``(workspace, seq)`` index every read uses.
* **Imports** restore the whole exported log of one workspace, under the same workspace name,
  into an empty workspace; positions are re-assigned, everything hashed is kept.

One store instance owns a database file. Should another connection commit to it anyway, the
writer notices (``PRAGMA data_version``) and reloads its cached heads before deciding anything.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import logging
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeAlias

import aiosqlite
import msgspec

from hub.core.backoff import Backoff
from hub.core.chain import GENESIS
from hub.core.checkpoint import CheckpointRecord
from hub.core.decoding import json_too_deep
from hub.core.errors import AgoraError, IntegrityError, Internal, NotFound, Unavailable
from hub.core.events import Event
from hub.core.merkle import (
    HASH_SIZE,
    frontier_indexes,
    frontier_root,
    group_size,
    stored_hash_leaf,
)
from hub.core.records import AppendResult, Head, JoinedPage, Snapshot
from hub.log.base import AppendItem, EventStore, TreeHead, read_ranges
from hub.log.blobs import FileBlobStore
from hub.log.codec import (
    READ_MAX_DEPTH,
    UNDECODABLE,
    as_bytes,
    decode_joined,
    decode_page,
    head_from_row,
    join_bodies,
)
from hub.log.ids import mint_ids
from hub.log.writer import (
    EMPTY_TIP,
    EMPTY_TREE,
    Append,
    Decision,
    GroupCommit,
    Tip,
    TreeBuilder,
    TreeGrowth,
    TreeTip,
    WriteOutcome,
    WriteRequest,
    batch_timestamp,
    chain,
    decide_batch,
    grow_groups,
    resolve,
)

SCHEMA_VERSION: Final = 3

_CREATE_META: Final = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
_SET_META: Final = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
_GET_META: Final = "SELECT value FROM meta WHERE key = ?"
_LEGACY_DEPTH: Final = "legacyDepth"
"""Set when the file was written by a hub before schema 2, which did not bound JSON nesting:
its readers check every page's depth (hub.log.codec.READ_MAX_DEPTH). A file created by this
version holds only events bounded on write, and its fast reads skip the check."""
"""1: events, snapshots. 2: merkle_hashes (runs of stored hashes per workspace and batch),
checkpoints. 3: the stored hashes move into ``events.tree`` (see the module docstring).
Opening an older file migrates it in one transaction (:func:`_migrate`): a version-1 file
gains the checkpoints table and each workspace's hashes are built from its events at its next
append or checkpoint (:meth:`SqliteEventStore.ensure_hashes`); a version-2 file's
``merkle_hashes`` runs are moved into the rows of their events and the table is dropped."""

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
        tree      BLOB,
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
    # Signed checkpoints (hub.core.checkpoint): the hub's note, and the cosignature lines
    # witnesses handed back.
    """
    CREATE TABLE IF NOT EXISTS checkpoints (
        workspace    TEXT    NOT NULL,
        size         INTEGER NOT NULL,
        note         TEXT    NOT NULL,
        cosignatures TEXT    NOT NULL DEFAULT '',
        PRIMARY KEY (workspace, size)
    ) WITHOUT ROWID
    """,
)

_INSERT: Final = (
    "INSERT INTO events (position, workspace, seq, id, kind, timestamp, hash, body, tree) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# Ids travel as one JSON array parameter so the statement text (and its prepared form) is
# the same whatever the number of ids.
_SELECT_IDS: Final = (
    "SELECT id, seq, body FROM events WHERE workspace = ? "
    "AND id IN (SELECT value FROM json_each(?))"
)
_SELECT_BODIES_BY_ID: Final = (
    "SELECT seq, body FROM events WHERE workspace = ? "
    "AND id IN (SELECT value FROM json_each(?)) ORDER BY seq"
)
_SELECT_TIP: Final = (
    "SELECT seq, hash, position, timestamp FROM events WHERE workspace = ? "
    "ORDER BY seq DESC LIMIT 1"
)
_SELECT_KINDS_SINCE: Final = "SELECT DISTINCT kind FROM events WHERE workspace = ? AND seq > ?"
_SELECT_HEAD: Final = (
    "SELECT workspace, seq, hash, timestamp, position FROM events "
    "WHERE workspace = ? ORDER BY seq DESC LIMIT 1"
)
# The scans for what a dead worker left open (hub.server.reaper): a full pass over the rows
# (SQLite keeps no index on kind), the byte search only narrowing; the caller decodes.
_SELECT_KINDS: Final = (
    "SELECT workspace, seq, body FROM events WHERE kind IN (SELECT value FROM json_each(?)) "
    "AND instr(body, ?) > 0 ORDER BY position"
)
_SELECT_KINDS_IN: Final = (
    "SELECT workspace, seq, body FROM events WHERE workspace = ? "
    "AND kind IN (SELECT value FROM json_each(?)) AND instr(body, ?) > 0 ORDER BY seq"
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
    "SELECT CAST(group_concat(body, ',') AS BLOB), count(*), max(seq) FROM ("
    "SELECT seq, body FROM events WHERE workspace = ? AND seq > ? AND seq <= ? "
    "ORDER BY seq LIMIT ?)"
)
_CONCAT_ALL: Final = (
    "SELECT CAST(group_concat(body, ',') AS BLOB), count(*), max(position) FROM ("
    "SELECT position, body FROM events WHERE position > ? ORDER BY position LIMIT ?)"
)
_SELECT_ALL: Final = (
    "SELECT position, body FROM events WHERE position > ? ORDER BY position LIMIT ?"
)
_SELECT_SNAPSHOT: Final = (
    "SELECT seq, body FROM snapshots WHERE workspace = ? AND name = ? AND version = ? "
    "AND seq <= ? ORDER BY seq DESC LIMIT 1"
)

# The tree groups of the events holding the wanted stored hashes (one index probe each; the
# seqs travel as one JSON array, as _SELECT_IDS's ids); sliced by _hash_map.
_SELECT_TREES: Final = (
    "SELECT seq, tree FROM events WHERE workspace = ? AND seq IN (SELECT value FROM json_each(?))"
)
_SELECT_MOVED: Final = "SELECT DISTINCT workspace FROM events WHERE position >= ?"
_SET_TREE: Final = "UPDATE events SET tree = ? WHERE workspace = ? AND seq = ?"
_INSERT_CHECKPOINT: Final = (
    "INSERT OR IGNORE INTO checkpoints (workspace, size, note, cosignatures) VALUES (?, ?, ?, ?)"
)
_SELECT_CHECKPOINT: Final = (
    "SELECT workspace, size, note, cosignatures FROM checkpoints WHERE workspace = ? AND size = ?"
)
_SELECT_LATEST_CHECKPOINT: Final = (
    "SELECT workspace, size, note, cosignatures FROM checkpoints "
    "WHERE workspace = ? ORDER BY size DESC LIMIT 1"
)
_SELECT_CHECKPOINTS: Final = (
    "SELECT workspace, size, note, cosignatures FROM checkpoints WHERE workspace = ? ORDER BY size"
)

_MAX_SEQ: Final = 2**63 - 1
DEFAULT_QUEUE_MAX: Final = 4096
_MAX_CACHED_HEADS: Final = 100_000
_REBUILD_PAGE: Final = 5000  # events per page when rebuilding a workspace's stored hashes
DEFAULT_BUSY_TIMEOUT_S: Final = 5.0
# Bound the WAL file left behind after a checkpoint (it is otherwise never truncated).
_JOURNAL_SIZE_LIMIT: Final = 64 * 1024 * 1024
# Checkpoint every ~16 MB of WAL instead of SQLite's 4 MB: a group commit dirties many pages,
# and a longer interval copies each hot page (index tails) back once per checkpoint rather
# than several times. Measured gain under 64 writers: 0-30%, noisy on a shared VM.
_WAL_AUTOCHECKPOINT_PAGES: Final = 4000
_json: Final = msgspec.json.Encoder()

_Row: TypeAlias = tuple[int, str, int, str, str, int, str, bytes, bytes | None]
# A small write that rides along the next batch's transaction (_Writer.ride): its statement,
# its parameters, and the future told its row count once that transaction commits.
_Future: TypeAlias = "concurrent.futures.Future[int]"
_Rider: TypeAlias = tuple[str, tuple[Any, ...], _Future]


def _row(event: Event, body: bytes, tree: bytes | None) -> _Row:
    """The ``_INSERT`` parameters of a sealed event (``tree``: the stored hashes its leaf
    adds, None with the tree off)."""
    return (
        event.position,
        event.workspace,
        event.seq,
        event.id,
        event.kind,
        event.timestamp,
        event.hash or GENESIS,
        body,
        tree,
    )


def _translate(e: sqlite3.Error, doing: str) -> AgoraError:
    """Map a driver error to the hub's taxonomy (the one place this happens for reads)."""
    name = getattr(e, "sqlite_errorname", "")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return IntegrityError(f"database is damaged while {doing}: {e}", sqlite=name)
    return Unavailable(f"database error while {doing}: {e}", sqlite=name)


WALKERS: Final = 2
"""Reader connections for long walks (:meth:`SqliteEventStore.joined_pages`): one per core of
the machines measured (docs/events.md, "Replay")."""


async def _open_reader(path: Path | str, *, uri: bool = False) -> aiosqlite.Connection:
    conn = await aiosqlite.connect(path, isolation_level=None, uri=uri)
    try:
        await conn.execute("PRAGMA query_only=1")
        await conn.execute("PRAGMA cache_size=-32768")  # 32 MiB for replays
    except BaseException:
        await conn.close()
        raise
    return conn


_log = logging.getLogger("agora.log")  # the store's own messages (follow, walkers)

FOLLOW_RETRY: Final = Backoff(initial=0.05, maximum=5.0, give_up_after=None)
"""Between failed polls of :meth:`SqliteEventStore.follow`: retried until the file is back."""

_FOLLOW_ROWS: Final = (
    "SELECT position, workspace, seq FROM events WHERE position > ? ORDER BY position LIMIT ?"
)
FOLLOW_PAGE: Final = 10_000
"""Rows one poll of :meth:`SqliteEventStore.follow` reads at most (a full page is followed by
the next at once, without waiting for the file to change again): what a poll holds is
bounded whatever another process wrote meanwhile (an import of a long log)."""

OwnRanges: TypeAlias = "collections.deque[tuple[int, int]]"
"""The (first, last) positions of this store's own commits, in commit order, while it follows
the file: added by whoever learns of the commit (the writer thread, or the loop when a handoff
is answered), taken by the poll once it passed them (deque: thread-safe append and popleft)."""


def _follow_start(conn: sqlite3.Connection) -> tuple[int, int]:
    """The file's data version and last position now (what following starts after)."""
    version = int(conn.execute("PRAGMA data_version").fetchone()[0])
    row = conn.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()
    return version, int(row[0])


def _follow_read(
    conn: sqlite3.Connection, version: int, position: int, anyway: bool
) -> tuple[int, list[tuple[int, str, int]]] | None:
    """None when nothing was committed since ``version`` (unless ``anyway``: the last page
    was full); else the data version now and the rows past ``position`` (at most
    :data:`FOLLOW_PAGE`, in position order). Only the small columns, never the bodies."""
    now = int(conn.execute("PRAGMA data_version").fetchone()[0])
    if now == version and not anyway:
        return None
    return now, conn.execute(_FOLLOW_ROWS, (position, FOLLOW_PAGE)).fetchall()


def _others(
    rows: list[tuple[int, str, int]], position: int, own: OwnRanges
) -> tuple[int, list[tuple[str, int]]]:
    """The last position of ``rows`` (``position`` if none) and the head of each workspace
    other writers moved among them. The rows of ``own`` are left out: the process folds its
    own appends, and a hint for each would cost a read. Taken after the read, so every own
    commit the read saw is in it (as long as it was recorded once committed)."""
    ranges = list(own)
    heads: dict[str, int] = {}
    last, i = position, 0
    for row_position, workspace, seq in rows:
        last = row_position
        while i < len(ranges) and ranges[i][1] < row_position:
            i += 1
        if i < len(ranges) and ranges[i][0] <= row_position:
            continue  # this process's own commit
        heads[workspace] = seq  # rows come in position order: a workspace's seqs grow
    while own and own[0][1] <= last:
        own.popleft()
    return last, list(heads.items())


class _Writer:
    """The writing side. Every method runs on the store's single writer thread."""

    def __init__(self, path: Path, busy_timeout: float, merkle: bool = True) -> None:
        self.legacy_depth = True
        self.path = path
        self.busy_timeout = busy_timeout
        self.merkle = merkle
        self.conn: sqlite3.Connection | None = None
        self.heads: dict[str, Tip] = {}
        # Read from the loop too (EventStore.tree_head): each entry is replaced whole, after
        # its commit, never mutated.
        self.trees: dict[str, TreeTip] = {}
        self._lineages = itertools.count(1)  # TreeTip.lineage of each tree loaded or rebuilt
        self.next_position: int | None = None  # None: reload from the database
        self.data_version: int | None = None
        self.last_timestamp = 0
        # While follow() runs: the position ranges this writer committed (deque: appended
        # here, taken by follow's poll on another thread).
        self.own: OwnRanges | None = None
        # Riders (see _Rider) queued from the loop; taken on this thread (deque: thread-safe
        # append and popleft).
        self.riders: collections.deque[_Rider] = collections.deque()
        self._taken: list[_Rider] = []  # riders written in the open transaction

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
                    _migrate(conn)
                conn.execute(_CREATE_META)
                if 0 < version < 2:
                    # Written by a hub that did not bound nesting: readers check every page.
                    conn.execute(_SET_META, (_LEGACY_DEPTH, "1"))
                self.legacy_depth = conn.execute(_GET_META, (_LEGACY_DEPTH,)).fetchone() is not None
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
        while self.riders:
            _, _, future = self.riders.popleft()
            _tell(future, Unavailable("the store closed before this write"))

    def _load_position(self) -> None:
        assert self.conn is not None
        row = self.conn.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()
        self.next_position = int(row[0]) + 1

    def _forget(self) -> None:
        """Drop everything cached; it is reloaded from the database when next needed."""
        self.heads.clear()
        self.trees.clear()
        self.next_position = None

    def _forget_others(self, conn: sqlite3.Connection) -> None:
        """Drop what is cached of the workspaces another connection appended to. Event rows
        are only ever added, at positions past every committed one (under the write lock),
        so the rows from our next position on are exactly the others' (``agora serve
        --workers``: several processes append to one file, each to its own workspaces
        mostly, and each would otherwise reload every head after every commit of another)."""
        if self.next_position is None:
            self._forget()
            return
        moved = conn.execute(_SELECT_MOVED, (self.next_position,)).fetchall()
        for (workspace,) in moved:
            self.heads.pop(workspace, None)
            self.trees.pop(workspace, None)
        self.next_position = None

    def _check_cached(self, conn: sqlite3.Connection, batch: list[WriteRequest]) -> None:
        """After another connection committed: drop the cached head (and tree) of each
        workspace of ``batch`` whose last row is no longer the one cached. Appends past our
        position are :meth:`_forget_others`'; this catches the rest, a log cut or its last
        event rewritten behind the store's back, so the batch chains onto what the file holds
        and the tree is loaded again (a new lineage: the next checkpoint checks it against
        the last one signed, hub.checkpoints). One indexed lookup per cached workspace."""
        for workspace in {req.workspace for req in batch}:
            tip = self.heads.get(workspace)
            if tip is None:
                continue
            row = conn.execute(_SELECT_TIP, (workspace,)).fetchone()
            if row is None or (row[0], row[1]) != (tip[0], tip[1]):
                self.heads.pop(workspace, None)
                self.trees.pop(workspace, None)

    def _tip(self, workspace: str) -> Tip:
        """The workspace's tip: cached, else read (in the batch's transaction)."""
        tip = self.heads.get(workspace)
        if tip is None:
            assert self.conn is not None
            row = self.conn.execute(_SELECT_TIP, (workspace,)).fetchone()
            tip = EMPTY_TIP if row is None else (row[0], row[1], row[2], row[3])
            self.heads[workspace] = tip
        return tip

    # -- the batch --------------------------------------------------------------------------

    def write(self, batch: list[WriteRequest]) -> list[WriteOutcome]:
        """Write one batch in one transaction; one outcome per request, in order."""
        conn = self.conn
        if conn is None:
            return [Unavailable("the store is closed") for _ in batch]
        try:
            conn.execute("BEGIN IMMEDIATE")
            decision, now = self._decide(conn, batch)
            trees: dict[str, TreeTip] = {}
            if decision.rows and self.merkle:
                groups, trees = grow_groups(
                    decision.growth, self._trees(conn, decision.growth), decision.staged
                )
                # Each workspace's groups are in seq order, as its rows are.
                nexts = {w: iter(g).__next__ for w, g in groups.items()}
                conn.executemany(
                    _INSERT, [_row(e, body, nexts[e.workspace]()) for e, body in decision.rows]
                )
            elif decision.rows:
                conn.executemany(_INSERT, [_row(e, body, None) for e, body in decision.rows])
            riders = self._take_riders(conn)
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._abort(conn)
            self._fail_riders(e)
            return [chain(Unavailable(f"could not commit the batch: {e}"), e) for _ in batch]
        except Exception as e:  # a bug: fail this batch only, keep the writer alive
            self._abort(conn)
            self._fail_riders(e)
            return [chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
        self._taken = []
        for future, count in riders:
            _tell(future, count)
        # Committed: only now do the staged heads become the truth.
        if len(self.heads) > _MAX_CACHED_HEADS:
            self.heads.clear()  # bounded: evicted heads are reloaded on demand
            self.trees.clear()
        self.heads.update(decision.staged)
        self.trees.update(trees)
        if self.own is not None and decision.rows:
            # (first, last) position this writer committed, for follow() to skip.
            self.own.append((decision.rows[0][0].position, decision.rows[-1][0].position))
        self.next_position = decision.position
        self.last_timestamp = now
        return decision.outcomes

    # -- riders: small writes that share a batch's transaction ----------------------------

    def _take_riders(self, conn: sqlite3.Connection) -> list[tuple[_Future, int]]:
        """Write the queued riders in the open transaction: (future, row count) of each, to
        be told once it commits (held in ``self._taken`` until then, to fail them if it
        does not)."""
        done: list[tuple[_Future, int]] = []
        taken = self._taken
        while self.riders:
            rider = self.riders.popleft()
            taken.append(rider)
            sql, params, future = rider
            done.append((future, conn.execute(sql, params).rowcount))
        return done

    def _fail_riders(self, cause: BaseException) -> None:
        """Fail the riders of a transaction that did not commit."""
        taken, self._taken = self._taken, []
        for _, _, future in taken:
            _tell(future, chain(Unavailable(f"could not commit the write: {cause}"), cause))

    def ride_alone(self) -> None:
        """Write the riders no batch took, in a transaction of their own (the store was idle
        when they came)."""
        conn = self.conn
        if conn is None or not self.riders:
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            riders = self._take_riders(conn)
            conn.execute("COMMIT")
        except Exception as e:  # sqlite3.Error, or a bug: either way its callers must hear
            self._abort(conn)
            self._fail_riders(e)
            return
        self._taken = []
        for future, count in riders:
            _tell(future, count)

    def _abort(self, conn: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        self._forget()

    def _decide(self, conn: sqlite3.Connection, batch: list[WriteRequest]) -> tuple[Decision, int]:
        """Check and seal every request of the batch in memory (:func:`decide_batch`); nothing is
        written yet. Returns the decision and the batch's timestamp."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self.data_version:
            # Another connection committed: the heads it moved are stale here.
            self.data_version = version
            self._forget_others(conn)
            self._check_cached(conn, batch)
        if self.next_position is None:
            self._load_position()
        assert self.next_position is not None
        now = batch_timestamp(self.last_timestamp)
        decision = decide_batch(
            batch,
            tip=self._tip,
            known=self._known_ids(conn, batch),
            position=self.next_position,
            now=now,
            mint=mint_ids,
            tree=self.merkle,
            kinds_since=lambda workspace, seq: [
                kind for (kind,) in conn.execute(_SELECT_KINDS_SINCE, (workspace, seq))
            ],
        )
        return decision, now

    def _known_ids(
        self, conn: sqlite3.Connection, batch: list[WriteRequest]
    ) -> dict[tuple[str, str], tuple[int, bytes]]:
        """Client-chosen ids of this batch already stored: (workspace, id) → (seq, body)."""
        by_workspace: dict[str, list[str]] = {}
        for req in batch:
            if isinstance(req, Append) and req.client_ids:
                by_workspace.setdefault(req.workspace, []).extend(req.client_ids)
        known: dict[tuple[str, str], tuple[int, bytes]] = {}
        for workspace, ids in by_workspace.items():
            tip = self.heads.get(workspace)
            if tip is not None and tip[0] == 0:
                continue  # an empty workspace holds no ids
            for id_, seq, body in conn.execute(_SELECT_IDS, (workspace, _json.encode(ids))):
                known[(workspace, id_)] = (seq, as_bytes(body))
        return known

    # -- the Merkle tree ---------------------------------------------------------------------

    def _trees(self, conn: sqlite3.Connection, growth: dict[str, TreeGrowth]) -> dict[str, TreeTip]:
        """The tree each written workspace grows from: cached, else its frontier read back,
        else rebuilt from the events (in the batch's transaction)."""
        trees: dict[str, TreeTip] = {}
        for workspace, grown in growth.items():
            tree = self.trees.get(workspace)
            if tree is None or not tree.matches(grown.size, grown.head):
                tree = self._load_tree(conn, workspace, grown.size, grown.head)
            trees[workspace] = tree
        return trees

    def _load_tree(self, conn: sqlite3.Connection, workspace: str, size: int, head: str) -> TreeTip:
        # (Hashes of events cut from the log behind the store's back went with their rows.)
        if size == 0:
            return EMPTY_TREE._replace(lineage=next(self._lineages))
        indexes = frontier_indexes(size)
        found = _read_hashes(conn.execute, workspace, indexes)
        if all(i in found for i in indexes):
            return TreeTip(size, head, tuple(found[i] for i in indexes), next(self._lineages))
        tip = self._rebuild(conn, workspace, size)
        assert tip.head == head, "bad math: rebuilt tree is of another head"
        return tip

    def _rebuild(self, conn: sqlite3.Connection, workspace: str, size: int) -> TreeTip:
        """Rewrite the stored hashes of events 1..size from the events (in a transaction)."""
        builder = TreeBuilder(workspace)
        after = 0
        while after < size:
            page = conn.execute(_SELECT_RANGE, (workspace, after, size, _REBUILD_PAGE)).fetchall()
            if not page:
                break
            events = decode_page([r[1] for r in page], [r[0] for r in page], "seq")
            conn.executemany(
                _SET_TREE, [(group, workspace, seq) for group, seq in builder.add_groups(events)]
            )
            after = events[-1].seq
        return builder.tip._replace(lineage=next(self._lineages))

    def rebuild_hashes(self, workspace: str) -> int:
        conn = self.conn
        if conn is None:
            raise Unavailable("the store is closed")
        try:
            conn.execute("BEGIN IMMEDIATE")
            self.trees.pop(workspace, None)
            row = conn.execute(_SELECT_TIP, (workspace,)).fetchone()
            size = 0 if row is None else int(row[0])
            tip = self._rebuild(conn, workspace, size)
            conn.execute("COMMIT")
        except BaseException as e:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise _translate(e, "rebuilding the Merkle hashes") from e
            raise
        self.trees[workspace] = tip
        return size

    # -- checkpoints -------------------------------------------------------------------------

    def set_cosignatures(self, workspace: str, size: int, cosignatures: str) -> None:
        count = self._in_transaction(
            "UPDATE checkpoints SET cosignatures = ? WHERE workspace = ? AND size = ?",
            (cosignatures, workspace, size),
            "saving cosignatures",
        )
        if count != 1:
            raise NotFound(
                f"no checkpoint of {workspace!r} at size {size}", workspace=workspace, size=size
            )

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


class SqliteEventStore(EventStore):
    """The SQLite :class:`EventStore` (see the module docstring for the design).

    ``path``: the database file (its directory is created). ``blobs_dir``: where the
    :class:`FileBlobStore` keeps blobs (default ``<path's directory>/blobs``). ``batch_max``:
    the most events one group commit writes (a larger single request is written alone).
    ``queue_max``: the most requests waiting for the writer (one ``append_many`` call counts
    once); ``append`` then waits for room.
    ``busy_timeout``: seconds to wait for a lock held by another process. ``merkle``: keep
    each workspace's Merkle tree (docs/audit.md); off only to measure what it costs
    (bench/log_bench.py): hashes left out are built from the events at the next append with
    it on. ``read_only``: open an existing file to read it only (``agora verify``'s worker
    processes): no writer, every connection opened ``mode=ro``; appends and other writes fail
    with :class:`Unavailable`, and a file whose schema is not this code's is refused.
    """

    def __init__(
        self,
        path: Path,
        *,
        blobs_dir: Path | None = None,
        batch_max: int = 1024,
        queue_max: int = DEFAULT_QUEUE_MAX,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S,
        merkle: bool = True,
        read_only: bool = False,
    ) -> None:
        if batch_max < 1 or queue_max < 1:
            raise ValueError("batch_max and queue_max must be >= 1")
        self.path = Path(path)
        self.batch_max = batch_max
        self.queue_max = queue_max
        self.busy_timeout = busy_timeout
        self.merkle = merkle
        self.read_only = read_only
        self.blob_root = blobs_dir if blobs_dir is not None else self.path.parent / "blobs"
        self.blobs = FileBlobStore(self.blob_root)
        self._writer: _Writer | None = None
        self.legacy_depth = True  # until opened: check (see _LEGACY_DEPTH)
        self._executor: ThreadPoolExecutor | None = None
        self._reader: aiosqlite.Connection | None = None
        # More connections for long walks (joined_pages), each on its own thread: SQLite
        # steps a query with the GIL released, so two ranges of a replay are read at once.
        self._walkers: tuple[aiosqlite.Connection, ...] = ()
        # What the walkers open once the store is open (file or read-only URI, is a URI),
        # and the lock that opens them once (and that closing waits for).
        self._walker_target: tuple[Path | str, bool] | None = None
        self._walking = asyncio.Lock()
        self._commits = GroupCommit(batch_max=batch_max, queue_max=queue_max)
        self._opening = asyncio.Lock()
        self._committing = False  # a batch is on the writer thread (or about to be)
        self._follow_every: float | None = None  # see follow_other_writers

    def __repr__(self) -> str:
        return f"SqliteEventStore({str(self.path)!r})"

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open (or create) the database and start the writer. Idempotent while open.

        Raises :class:`Unavailable` if the file cannot be opened or has a newer schema.
        """
        async with self._opening:
            if self._commits.task is None:
                await self._open()

    async def _open(self) -> None:
        if self.read_only:
            await self._open_read_only()
            return
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agora-sqlite-writer")
        writer = _Writer(self.path, self.busy_timeout, self.merkle)
        reader: aiosqlite.Connection | None = None
        try:
            await loop.run_in_executor(executor, writer.open)
            await asyncio.to_thread(self.blob_root.mkdir, parents=True, exist_ok=True)
            reader = await _open_reader(self.path)
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
        self._walker_target = (self.path, False)
        self.legacy_depth = writer.legacy_depth
        self._commits.start(self._commit, name=f"agora-writer:{self.path}")

    async def _open_read_only(self) -> None:
        # mode=ro: the file must exist, and these connections can never write to it.
        target = f"{(await asyncio.to_thread(self.path.resolve)).as_uri()}?mode=ro"
        await self._open_reading(
            target, uri=True, how="read-only (opening it to write migrates it)"
        )
        # Appends are refused by the writer task, so the store's lifecycle (open, close,
        # what a closed store answers) is the same as a writable one's.
        self._commits.start(self._refuse, name=f"agora-reader:{self.path}")

    async def _open_reading(self, target: Path | str, *, uri: bool, how: str) -> None:
        """Open the reader of a store that does not migrate the file (read-only, or handing
        its writes to another process, :mod:`hub.log.handoff`): a file whose schema is not
        this code's is refused (``how``: how this store reads it, for the message). Raises
        :class:`Unavailable`."""
        try:
            reader = await _open_reader(target, uri=uri)
        except sqlite3.Error as e:
            raise _translate(e, f"opening {self.path}") from e
        try:
            (version,) = next(iter(await reader.execute_fetchall("PRAGMA user_version")))
            if version != SCHEMA_VERSION:
                raise Unavailable(
                    f"{self.path} has schema version {version}, this hub reads "
                    f"{SCHEMA_VERSION} {how}",
                    version=version,
                )
            legacy = await reader.execute_fetchall(_GET_META, (_LEGACY_DEPTH,))
        except BaseException as e:
            with contextlib.suppress(sqlite3.Error, ValueError):
                await reader.close()
            if isinstance(e, sqlite3.Error):
                raise _translate(e, f"opening {self.path}") from e
            raise
        self._reader, self._walker_target = reader, (target, uri)
        self.legacy_depth = bool(list(legacy))

    async def _refuse(self, batch: list[WriteRequest]) -> None:
        resolve(batch, [Unavailable(f"{self.path} is open read-only") for _ in batch])

    async def close(self) -> None:
        """Stop taking appends, commit every pending one, then release everything.

        Idempotent; concurrent calls all wait for the same shutdown.
        """
        await self._commits.close(self._release)

    async def _release(self) -> None:
        loop = asyncio.get_running_loop()
        async with self._walking:  # after any walker connection being opened
            self._walker_target = None
            for conn in (self._reader, *self._walkers):
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error, ValueError):
                        await conn.close()
            self._walkers = ()
        if self._writer is not None and self._executor is not None:
            # Runs after any hop still in flight (one thread, FIFO).
            await loop.run_in_executor(self._executor, self._writer.close)
            self._executor.shutdown(wait=False)
        self._reader = self._writer = self._executor = None

    # -- the writer task (hub.log.writer.GroupCommit) calls this with each batch ------------

    async def _commit(self, batch: list[WriteRequest]) -> None:
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
        self._committing = True

        commits = self._commits

        def report(outcomes: list[WriteOutcome]) -> None:  # on the loop
            commits.settle(batch, outcomes)
            if not done.done():
                done.set_result(None)

        def job() -> None:  # on the writer thread
            try:
                outcomes = writer.write(batch)
            except BaseException as e:  # write() catches errors; this is the last resort
                outcomes = [chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
            # A closed loop means nobody is left to tell; the batch's outcome stands.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(report, outcomes)

        self._executor.submit(job)
        try:
            await done
        finally:
            self._committing = False
            if writer.riders:
                # Queued after this batch took its riders: the next batch takes them if the
                # writer task starts one at once (it does when appends are queued), else
                # they go alone.
                loop.call_soon(self._ride_if_idle)

    def _ride_if_idle(self) -> None:
        writer, executor = self._writer, self._executor
        if not self._committing and writer is not None and executor is not None and writer.riders:
            executor.submit(writer.ride_alone)

    async def _ride(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one small write in the next batch's transaction (its fsync covers it), or
        alone when no batch is under way; return its row count once committed. Checkpoints
        come once per ~1,000 events: a transaction of their own would cost the writer an
        fsync each, a batch's worth of appends (bench/log_bench.py (d))."""
        writer = self._writer_or_raise()
        assert self._executor is not None
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        writer.riders.append((sql, params, future))
        if not self._committing:
            self._executor.submit(writer.ride_alone)
        return await asyncio.wrap_future(future)

    # -- writing ----------------------------------------------------------------------------

    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        expected_seq: int | None = None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        """See :meth:`EventStore.append`."""
        return await self._commits.append(workspace, drafts, expected_seq, reads)

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | Exception]:
        """See :meth:`EventStore.append_many` (queued at once, one wake-up)."""
        return list(await self._commits.append_many(workspace, items))

    async def append_each(
        self, items: Sequence[tuple[str, AppendItem]]
    ) -> list[AppendResult | AgoraError]:
        """Appends to any workspaces, queued at once in order as one entry and awaited
        together: a batch another process handed this store (:mod:`hub.log.handoff`). See
        :meth:`hub.log.writer.GroupCommit.append_each`."""
        return await self._commits.append_each(items)

    async def import_events(self, workspace: str, events: Sequence[Event]) -> int:
        """See :meth:`EventStore.import_events`."""
        return await self._commits.import_events(workspace, events)

    # -- the Merkle tree and checkpoints ----------------------------------------------------

    async def read_hash_map(self, workspace: str, indexes: Sequence[int]) -> dict[int, bytes]:
        """See :meth:`EventStore.read_hash_map`. Raises ``Unavailable``."""
        if not indexes:
            return {}
        places = [stored_hash_leaf(i) for i in indexes]
        seqs = sorted({leaf + 1 for leaf, _ in places})
        rows = await self._fetch(
            _SELECT_TREES, (workspace, _json.encode(seqs)), "reading Merkle hashes"
        )
        return _hash_map(indexes, places, rows)

    def tree_head(self, workspace: str) -> TreeHead | None:
        """See :meth:`EventStore.tree_head`: the writer's cached tree of ``workspace``
        (replaced whole after each commit, so reading it from the loop sees one committed
        tip), or None when it is not cached (evicted, forgotten after another process wrote,
        the tree off)."""
        writer = self._writer
        tip = None if writer is None else writer.trees.get(workspace)
        if tip is None or not tip.lineage:
            return None
        return TreeHead(tip.size, frontier_root(tip.frontier), tip.lineage)

    async def rebuild_hashes(self, workspace: str) -> int:
        """See :meth:`EventStore.rebuild_hashes` (on the writer thread, between batches)."""
        size: int = await self._on_writer(self._writer_or_raise().rebuild_hashes, workspace)
        return size

    async def save_checkpoint(self, record: CheckpointRecord) -> bool:
        """See :meth:`EventStore.save_checkpoint` (written with the next batch: :meth:`_ride`).
        Raises :class:`Unavailable`."""
        params = (record.workspace, record.size, record.note, record.cosignatures)
        return await self._ride(_INSERT_CHECKPOINT, params) == 1

    async def set_cosignatures(self, workspace: str, size: int, cosignatures: str) -> None:
        """See :meth:`EventStore.set_cosignatures`."""
        await self._on_writer(
            self._writer_or_raise().set_cosignatures, workspace, size, cosignatures
        )

    async def load_checkpoint(
        self, workspace: str, size: int | None = None
    ) -> CheckpointRecord | None:
        """See :meth:`EventStore.load_checkpoint`. Raises ``Unavailable``."""
        if size is None:
            rows = await self._fetch(_SELECT_LATEST_CHECKPOINT, (workspace,), "reading checkpoints")
        else:
            rows = await self._fetch(_SELECT_CHECKPOINT, (workspace, size), "reading checkpoints")
        return _checkpoint(rows[0]) if rows else None

    async def list_checkpoints(self, workspace: str) -> list[CheckpointRecord]:
        """See :meth:`EventStore.list_checkpoints`. Raises ``Unavailable``."""
        rows = await self._fetch(_SELECT_CHECKPOINTS, (workspace,), "reading checkpoints")
        return [_checkpoint(r) for r in rows]

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
        if self._writer is None or not self._commits.accepting:
            if self.read_only and self._commits.accepting:
                raise Unavailable(f"{self.path} is open read-only")
            raise Unavailable("the store is not open")
        return self._writer

    async def _on_writer(self, fn: Any, *args: Any) -> Any:
        # A plain await (no shield): a cancelled caller just stops waiting; the job itself
        # runs to completion on the writer thread.
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- following other processes' commits -----------------------------------------------

    def follow_other_writers(self, every_s: float) -> None:
        """Make :meth:`follow` report what other processes commit to the file, looking every
        ``every_s`` seconds (``agora serve --workers``: several processes share the file).
        Without it, :meth:`follow` returns at once: the store is the file's only writer."""
        if every_s <= 0:
            raise ValueError("every_s must be > 0")
        self._follow_every = every_s

    async def follow(
        self, notify: Callable[[str, int], None], *, resumed: Callable[[], None]
    ) -> None:
        """Report commits to the file (this process's too) until cancelled; see
        :meth:`EventStore.follow`. Polls on a connection of its own: ``PRAGMA data_version``
        (it changes when ANY other connection committed), and when it moved, every
        workspace's highest seq among the rows past the last position seen. SQLite
        serializes writers and positions are assigned under the write lock, so positions
        grow in commit order: a position seen means every lower one is committed. A
        failed poll is logged, the connection reopened and ``resumed`` called again."""
        every = self._follow_every
        if every is None:
            return
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            conn: sqlite3.Connection | None = None
            own: OwnRanges = collections.deque()
            # One thread owns the connection: a poll still running when this task is
            # cancelled finishes before the close queued behind it (closing a connection
            # another thread is using crashes the process).
            thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agora-sqlite-follow")
            try:
                conn = await loop.run_in_executor(thread, self._follow_connect)
                version, position = await loop.run_in_executor(thread, _follow_start, conn)
                self._track_own(own)  # its commits from now on are not reported
                resumed()
                failures = 0
                full = False
                while True:
                    if not full:
                        await asyncio.sleep(every)
                    read = await loop.run_in_executor(
                        thread, _follow_read, conn, version, position, full
                    )
                    if read is None:
                        continue
                    version, rows = read
                    full = len(rows) == FOLLOW_PAGE
                    await self._own_recorded()
                    position, heads = await loop.run_in_executor(
                        thread, _others, rows, position, own
                    )
                    for workspace, head in heads:
                        notify(workspace, head)
            except (sqlite3.Error, OSError) as e:
                _log.warning("following %s failed: %s; retrying", self.path, e)
                await asyncio.sleep(FOLLOW_RETRY.delay(failures))
                failures += 1
            finally:
                self._untrack_own(own)
                if conn is not None:
                    thread.submit(conn.close)
                thread.shutdown(wait=False)

    def _track_own(self, own: OwnRanges) -> None:
        """From now on record in ``own`` the (first, last) position of each commit of this
        store's, in commit order, for :meth:`follow` to leave out."""
        if self._writer is not None:
            self._writer.own = own

    def _untrack_own(self, own: OwnRanges) -> None:
        if self._writer is not None and self._writer.own is own:
            self._writer.own = None

    async def _own_recorded(self) -> None:
        """Once every commit of this store's that a poll just read is in the ranges it
        records (here at once: the writer thread records each as it commits)."""

    def _follow_connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA query_only=1")
        return conn

    # -- reading ----------------------------------------------------------------------------

    async def _fetch(
        self,
        sql: str,
        params: Sequence[Any],
        doing: str,
        reader: aiosqlite.Connection | None = None,
    ) -> list[Any]:
        reader = reader or self._reader
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
        return decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")

    async def _concat_page(self, sql: str, params: tuple[Any, ...], key: str) -> list[Event] | None:
        """A page through the concatenating query, or None to use the row-wise one."""
        try:
            rows = await self._fetch(sql, params, "reading events")
        except Unavailable as e:
            if e.details.get("sqlite") == "SQLITE_TOOBIG":
                return None  # a page of huge events: fetch it row by row
            raise
        blob, count, _ = rows[0]
        if not count:
            return []
        try:
            events = decode_joined(b"[" + blob + b"]", legacy=self.legacy_depth)
        except UNDECODABLE:
            return None  # the row-wise path names the damaged row
        if len(events) != count or not _increasing(events, key):
            return None
        return events

    async def read_joined(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int = 1000,
    ) -> JoinedPage:
        """See :meth:`EventStore.read_joined`: the concatenating query's bytes as they are.
        Raises ``IntegrityError`` for a row nested too deep, ``Unavailable``."""
        return await self._read_joined(workspace, after_seq, until_seq, limit, None)

    def joined_pages(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        batch: int = 5000,
    ) -> AsyncGenerator[JoinedPage, None]:
        """See :meth:`EventStore.joined_pages`: ranges of seqs read by the walker
        connections at once (hub.log.base.read_ranges), the same pages in the same order.
        The walkers are opened by the first walk (a store that never replays a long log, as
        most commands' stores, keeps no thread for them); a store that cannot open them walks
        with its one reader."""
        return self._walk(workspace, after_seq, until_seq, batch)

    async def _walk(
        self, workspace: str, after_seq: int, until_seq: int | None, batch: int
    ) -> AsyncGenerator[JoinedPage, None]:
        walkers = await self._open_walkers()
        if not walkers:
            pages = super().joined_pages(
                workspace, after_seq=after_seq, until_seq=until_seq, batch=batch
            )
        else:

            def fetch_range(lo: int, hi: int, slot: int) -> Awaitable[JoinedPage]:
                return self._read_joined(workspace, lo, hi, hi - lo, walkers[slot])

            def fetch(after: int) -> Awaitable[JoinedPage]:
                return self._read_joined(workspace, after, until_seq, batch, walkers[0])

            pages = read_ranges(fetch_range, fetch, after_seq, until_seq, batch, len(walkers))
        async with contextlib.aclosing(pages):
            async for page in pages:
                yield page

    async def _open_walkers(self) -> tuple[aiosqlite.Connection, ...]:
        """The walker connections, opened on first use (none while the store is closed, or
        when they cannot be opened: the walk then reads with the store's reader)."""
        if self._walkers:
            return self._walkers
        async with self._walking:
            target = self._walker_target
            if self._walkers or target is None:
                return self._walkers
            opened: list[aiosqlite.Connection] = []
            try:
                for _ in range(WALKERS):
                    opened.append(await _open_reader(target[0], uri=target[1]))
            except (sqlite3.Error, OSError) as e:
                _log.warning("walking %s with one connection: %s", self.path, e)
                for conn in opened:
                    with contextlib.suppress(sqlite3.Error, ValueError):
                        await conn.close()
                self._walker_target = None  # not tried again
                return ()
            self._walkers = tuple(opened)
            return self._walkers

    async def _read_joined(
        self,
        workspace: str,
        after_seq: int,
        until_seq: int | None,
        limit: int,
        reader: aiosqlite.Connection | None,
    ) -> JoinedPage:
        if limit <= 0:
            return JoinedPage(body=b"[]", count=0, last_seq=after_seq)
        until = _MAX_SEQ if until_seq is None else until_seq
        params = (workspace, after_seq, until, limit)
        try:
            rows = await self._fetch(_CONCAT_RANGE, params, "reading events", reader)
        except Unavailable as e:
            if e.details.get("sqlite") != "SQLITE_TOOBIG":
                raise
        else:
            blob, count, last = rows[0]
            if not count:
                return JoinedPage(body=b"[]", count=0, last_seq=after_seq)
            body = b"[" + blob + b"]"
            # Only a file from before the nesting limit can hold a row too deep (READ_MAX_DEPTH).
            if not (self.legacy_depth and json_too_deep(body, READ_MAX_DEPTH + 1)):
                return JoinedPage(body=body, count=count, last_seq=last)
        # A page of huge events, or one too deep: row by row (which names a deep row).
        rows = await self._fetch(_SELECT_RANGE, params, "reading events", reader)
        return JoinedPage(
            body=join_bodies([r[1] for r in rows], [r[0] for r in rows], "seq"),
            count=len(rows),
            last_seq=rows[-1][0] if rows else after_seq,
        )

    async def read_raw(
        self, workspace: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes]]:
        """See :meth:`EventStore.read_raw`. Raises ``Unavailable``."""
        if limit <= 0:
            return []
        rows = await self._fetch(
            _SELECT_RANGE, (workspace, after_seq, _MAX_SEQ, limit), "reading events"
        )
        return [(seq, as_bytes(body)) for seq, body in rows]

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Event]:
        """See :meth:`EventStore.read_all`. Raises ``IntegrityError``, ``Unavailable``."""
        if limit <= 0:
            return []
        page = await self._concat_page(_CONCAT_ALL, (after_position, limit), "position")
        if page is not None:
            return page
        rows = await self._fetch(_SELECT_ALL, (after_position, limit), "reading events")
        return decode_page([r[1] for r in rows], [r[0] for r in rows], "position")

    async def read_kinds(
        self, kinds: Sequence[str], *, containing: bytes = b"", workspace: str | None = None
    ) -> list[tuple[str, int, bytes]]:
        """``(workspace, seq, body)`` of every stored event of one of ``kinds`` whose body
        holds the bytes ``containing`` (all: ``b""``), in ``workspace`` only when given, in
        commit order. For the rare scans of what a dead worker of ``agora serve --workers``
        left open (:mod:`hub.server.reaper`): the byte search only narrows, the caller
        decodes and decides. Raises ``Unavailable``."""
        # instr() on a BLOB compares bytes; an empty needle matches every row.
        needle = sqlite3.Binary(containing)
        names = _json.encode(list(kinds))
        if workspace is None:
            rows = await self._fetch(_SELECT_KINDS, (names, needle), "scanning events")
        else:
            rows = await self._fetch(
                _SELECT_KINDS_IN, (workspace, names, needle), "scanning events"
            )
        return [(w, seq, as_bytes(body)) for w, seq, body in rows]

    async def lookup_ids(self, workspace: str, ids: Sequence[str]) -> dict[str, Event]:
        """See :meth:`EventStore.lookup_ids`. Raises ``IntegrityError``, ``Unavailable``."""
        if not ids:
            return {}
        rows = await self._fetch(
            _SELECT_BODIES_BY_ID, (workspace, _json.encode(list(ids))), "looking up ids"
        )
        events = decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")
        return {e.id: e for e in events}

    async def head(self, workspace: str) -> Head | None:
        """See :meth:`EventStore.head`. Raises ``Unavailable``."""
        rows = await self._fetch(_SELECT_HEAD, (workspace,), "reading a head")
        return head_from_row(rows[0]) if rows else None

    async def heads(self) -> list[Head]:
        """See :meth:`EventStore.heads`. Raises ``Unavailable``."""
        return [head_from_row(r) for r in await self._fetch(_SELECT_HEADS, (), "reading heads")]


def _tell(future: _Future, outcome: int | BaseException) -> None:
    """Settle a rider's future from the writer thread (its caller may have given up: the
    write stands either way, as any job on the writer thread)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _hash_map(
    indexes: Sequence[int], places: Sequence[tuple[int, int]], rows: Iterable[Any]
) -> dict[int, bytes]:
    """The stored hashes ``indexes`` (at ``places``, :func:`stored_hash_leaf` of each) out of
    ``(seq, tree)`` rows, as index → hash. An event without its group (``tree`` NULL: the tree
    was off, or the hashes were never built) or with a short one holds none of them."""
    trees = {int(seq): tree for seq, tree in rows}
    found: dict[int, bytes] = {}
    for index, (leaf, offset) in zip(indexes, places, strict=True):
        tree = trees.get(leaf + 1)
        if tree is not None and len(tree) == group_size(leaf) * HASH_SIZE:
            found[index] = bytes(tree[offset * HASH_SIZE : (offset + 1) * HASH_SIZE])
    return found


def _read_hashes(
    execute: Callable[[str, tuple[Any, ...]], Iterable[Any]],
    workspace: str,
    indexes: Sequence[int],
) -> dict[int, bytes]:
    """:func:`_hash_map` of ``indexes`` read through ``execute`` (the writer's connection)."""
    places = [stored_hash_leaf(i) for i in indexes]
    seqs = sorted({leaf + 1 for leaf, _ in places})
    return _hash_map(indexes, places, execute(_SELECT_TREES, (workspace, _json.encode(seqs))))


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a file of an older schema (or a new one) to :data:`SCHEMA_VERSION`, inside the
    caller's transaction (see :data:`_LEGACY_DEPTH`'s note on the versions)."""
    for statement in _SCHEMA:
        conn.execute(statement)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
    if "tree" not in columns:
        conn.execute("ALTER TABLE events ADD COLUMN tree BLOB")  # NULL: no rewrite
    legacy = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'merkle_hashes'"
    ).fetchone()
    if legacy is not None:
        workspaces = [w for (w,) in conn.execute("SELECT DISTINCT workspace FROM merkle_hashes")]
        for workspace in workspaces:
            runs = conn.execute(
                "SELECT idx, hash FROM merkle_hashes WHERE workspace = ? ORDER BY idx",
                (workspace,),
            )
            conn.executemany(_SET_TREE, [(g, workspace, seq) for g, seq in _groups_of_runs(runs)])
        conn.execute("DROP TABLE merkle_hashes")
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _groups_of_runs(runs: Iterable[tuple[int, bytes]]) -> Iterator[tuple[bytes, int]]:
    """Schema 2's runs of a workspace (``(idx, hashes)`` in idx order) as (group, seq) of
    each event whose group they hold whole, from seq 1 up to the first gap (a missing tail
    is rebuilt from the events like any missing hashes)."""
    flat = bytearray()
    for idx, hashes in runs:
        if idx * HASH_SIZE != len(flat):
            break
        flat += hashes
    at, leaf = 0, 0
    while True:
        end = at + group_size(leaf) * HASH_SIZE
        if end > len(flat):
            return
        yield bytes(flat[at:end]), leaf + 1
        at, leaf = end, leaf + 1


def _checkpoint(row: Any) -> CheckpointRecord:
    workspace, size, note, cosignatures = row
    return CheckpointRecord(
        workspace=workspace, size=int(size), note=str(note), cosignatures=str(cosignatures)
    )


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
