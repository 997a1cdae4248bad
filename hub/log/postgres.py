"""The scale-out log store: PostgreSQL through asyncpg, shared by several hub nodes.

Same interface and semantics as :class:`hub.log.sqlite.SqliteEventStore` (the conformance
suite in tests/hub/log runs on both); what differs is how it stays correct with several
writers, each a hub node with its own store instance:

* **Per-workspace write locks.** Every writing transaction first takes a transaction advisory
  lock per workspace of its batch (:func:`workspace_lock_key`, in key order: no cycle), then
  reads those heads and holds the locks until COMMIT: a workspace's writers are serialized
  (gapless seqs, each batch on the head it read) while writers of different workspaces,
  on any node, commit in parallel. (Until migration 10, ``LOCK TABLE events IN EXCLUSIVE
  MODE`` serialized every writer.) It also takes the table ROW EXCLUSIVE, which holds off
  an older node's or an operator's EXCLUSIVE lock without serializing the writers.
* **Never skip a late commit.** Positions come from a sequence, in one block per batch taken
  with the transaction's id under a short lock (migration 10's ``take_positions``), so
  transaction-id order is block order; each row records its transaction (``tx``). ``read_all``
  stops at the first row whose transaction is not older than every running one
  (``pg_snapshot_xmin``): below it, any transaction holding a lower block has ended. A
  follower by position can therefore never see position *n + 1* while *n* is still to come;
  positions may have gaps (a refused request's, a failed transaction's). docs/operations.md,
  "Ordering", has the discussion.
* **One writer, group commit** (:mod:`hub.log.writer`, shared with the SQLite store):
  ``append`` enqueues on a bounded queue; one writer task owned by the store drains every
  queued request (up to ``batch_max`` events) into ONE transaction on its own connection: lock
  its workspaces, take its positions, read their heads and the already-stored ids, check and
  seal every request in memory (:func:`hub.log.writer.decide_batch`), then one statement
  inserts every row, updates ``heads`` and sends the notifications. One request's ``Conflict``
  never fails the others; a failed transaction fails every request of the batch with
  :class:`Unavailable` (then nothing of it was written, except when the connection died during
  COMMIT itself: the outcome is then unknown, and a retry with the same ids answers
  ``duplicate`` if it was written). Unlike SQLite's, a request whose caller was cancelled
  before its transaction began is dropped (a transaction here holds its workspaces' locks for
  every node), and a transaction under way is finished before a cancelled writer lets go.
* **Only storable text.** An id with NUL or lone surrogates cannot be held in a TEXT column:
  ``append`` and ``import_events`` refuse it (:class:`BadRequest`), and a read by such a name
  finds nothing. Minted ids are time-ordered (hub.log.ids), as on SQLite.
* **Heads are read inside the transaction** (never cached across transactions) because other
  nodes write too; ``heads`` is a table maintained in the same transaction as the events.
* **NOTIFY.** Each committing transaction calls ``pg_notify(channel, payload)`` once per
  workspace it wrote (:func:`notifications`): ``<workspace>:<seq>``, the workspace's new
  head, followed by ``:[body,…]``, that commit's events of the workspace as stored, when
  they fit in a notification (:data:`CARRY_MAX`). PostgreSQL delivers notifications only on
  COMMIT, in commit order, so a listener never hears of an event it cannot read; the events
  carried spare the other nodes reading them back (hub.cluster.follower), and without them
  the payload is a hint ("read after your last seq").
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
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Any, Final, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import asyncpg.pool

from hub.core.backoff import Backoff
from hub.core.chain import GENESIS
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import (
    AgoraError,
    BadRequest,
    IntegrityError,
    Internal,
    NotFound,
    TooLarge,
    Unavailable,
)
from hub.core.events import Event
from hub.core.merkle import HASH_SIZE, frontier_indexes, stored_hash_count
from hub.core.records import AppendResult, Head, JoinedPage, Snapshot
from hub.core.validation import SHA256_RE
from hub.log.base import (
    AppendItem,
    BlobIntent,
    BlobStore,
    CommitHint,
    EventStore,
    stamp_before,
)
from hub.log.blobs import DEFAULT_MAX_BLOB_BYTES
from hub.log.codec import decode_page, head_from_row, join_bodies
from hub.log.ids import mint_ids
from hub.log.migrations import Conn, check_version, migrate, quote, validate_schema
from hub.log.writer import (
    EMPTY_TIP,
    EMPTY_TREE,
    Append,
    Decision,
    GroupCommit,
    HashRow,
    Tip,
    TreeBuilder,
    TreeGrowth,
    TreeTip,
    WriteOutcome,
    WriteRequest,
    batch_timestamp,
    chain,
    decide_batch,
    grow_trees,
)

DEFAULT_SCHEMA: Final = "agora"
DEFAULT_POOL_SIZE: Final = 10
DEFAULT_QUEUE_MAX: Final = 4096
DEFAULT_BATCH_MAX: Final = 1024
BATCH_WORKSPACES_MAX: Final = 64
"""The most workspaces one transaction writes: it takes an advisory lock per workspace, and
PostgreSQL's lock table is shared by the whole server (``max_locks_per_transaction`` times the
connections: 64 times 100 by default), so a batch of 1024 workspaces from each of a few nodes could
take it all. A batch that would name more ends there; the next one takes the rest."""
DEFAULT_LOCK_TIMEOUT_S: Final = 10.0
DEFAULT_COMMAND_TIMEOUT_S: Final = 60.0
# ``follow``: how often the LISTEN connection is checked, and the reconnect backoff bounds.
FOLLOW_KEEPALIVE_S: Final = 5.0
FOLLOW_BACKOFF: Final = Backoff(initial=0.1, maximum=5.0, give_up_after=None)
URL_SCHEMES: Final = ("postgresql", "postgres")
# URL query options the store takes for itself (the rest of the URL goes to asyncpg as is).
_STORE_OPTIONS: Final = ("schema", "pool_size")

_MAX_SEQ: Final = 2**63 - 1
_MAX_CACHED_TREES: Final = 100_000
_REBUILD_PAGE: Final = 5000  # events per page when rebuilding a workspace's stored hashes

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"


def _columns(rows: list[tuple[Event, bytes]]) -> tuple[list[Any], ...]:
    """The column arrays of one multi-row ``INSERT … SELECT FROM unnest(…)``."""
    events = [event for event, _ in rows]
    return (
        [e.position for e in events],
        [e.workspace for e in events],
        [e.seq for e in events],
        [e.id for e in events],
        [e.kind for e in events],
        [e.timestamp for e in events],
        [e.hash or GENESIS for e in events],
        [body for _, body in rows],
    )


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


def _connection_lost(e: BaseException) -> bool:
    """Whether ``e``, raised by a statement, says the connection is gone (the server's word:
    SQLSTATE class 08, connection exception, or 57, operator intervention such as an ended
    backend or a shutdown; or the client's: a socket error, a connection asyncpg closed or
    left mid-operation when the server hung up), not that the statement failed."""
    if isinstance(e, asyncpg.PostgresError):
        return str(getattr(e, "sqlstate", "") or "")[:2] in ("08", "57")
    return isinstance(e, asyncpg.InterfaceError | asyncpg.InternalClientError | OSError)


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


def workspace_lock_key(schema: str, workspace: str) -> int:
    """The advisory lock key of ``workspace``'s writers in ``schema``: 64 bits of BLAKE2b,
    signed as PostgreSQL's bigint. (Advisory keys are the database's, shared by its schemas:
    the schema is hashed in.)"""
    digest = hashlib.blake2b(f"{schema}\x00{workspace}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


_TOUCHED: Final = (
    "greatest(now(), {b}.stored_at + interval '1 microsecond', "
    "timestamptz 'epoch' + (coalesce({at}::bigint, 0) + 1) * interval '1 microsecond')"
)
"""A touched blob's new ``stored_at``: strictly later than before and than the stamp ``at``."""


class _Sql:
    """Every statement, with the schema filled in once."""

    def __init__(self, schema: str) -> None:
        s = quote(schema)
        # Taken first by every writing transaction: ROW EXCLUSIVE (what an INSERT takes
        # anyway) does not conflict with itself, so writers of different workspaces run in
        # parallel, but it waits for (and holds off) anyone holding the table EXCLUSIVE: a
        # node of an older version (one table lock per batch) or an operator's lock.
        self.lock = f"LOCK TABLE {s}.events IN ROW EXCLUSIVE MODE"
        # The batch's block of $2 positions (migration 10's take_positions, evaluated once:
        # a CTE; past the last position stored, which an older node may have written) and
        # the heads of its workspaces, in one round trip: always one row (workspace NULL
        # when none of them has a head yet).
        self.tips = f"""
            WITH block AS (
                SELECT {s}.take_positions(
                    $2::bigint,
                    '{s}.positions',
                    (SELECT COALESCE(max(position), 0) FROM {s}.events)
                ) AS first
            )
            SELECT block.first, h.workspace, h.seq, h.hash, h.position, h.timestamp
            FROM block
            LEFT JOIN {s}.heads AS h ON h.workspace = ANY($1::text[])
        """
        self.known_ids = (
            f"SELECT e.workspace, e.id, e.seq, e.body FROM {s}.events AS e "
            "JOIN unnest($1::text[], $2::text[]) AS k(workspace, id) "
            "ON e.workspace = k.workspace AND e.id = k.id"
        )
        # The kinds appended to each workspace past a seq (decide_batch's kinds_since, for the
        # requests whose expected seq the head has passed): the last seq of each kind.
        self.kinds_since = (
            f"SELECT e.workspace, e.kind, max(e.seq) AS last FROM {s}.events AS e "
            "JOIN unnest($1::text[], $2::bigint[]) AS k(workspace, after) "
            "ON e.workspace = k.workspace AND e.seq > k.after GROUP BY e.workspace, e.kind"
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
            ), hashed AS (
                INSERT INTO {s}.merkle_hashes (workspace, idx, hash)
                SELECT * FROM unnest($16::text[], $17::bigint[], $18::bytea[])
            )
            SELECT count(pg_notify($14, p)) FROM unnest($15::text[]) AS p
        """
        self.insert_hashes = (
            f"INSERT INTO {s}.merkle_hashes (workspace, idx, hash) "
            "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bytea[])"
        )
        # Each wanted stored index: the run holding it (hub.log.writer.HashRow), sliced to
        # its 32 bytes; a slice past the run's end comes back short (not stored).
        self.hashes = f"""
            SELECT w.want, substring(r.hash FROM ((w.want - r.idx) * 32 + 1)::int FOR 32)
            FROM unnest($2::bigint[]) AS w(want)
            JOIN LATERAL (
                SELECT idx, hash FROM {s}.merkle_hashes
                WHERE workspace = $1 AND idx <= w.want ORDER BY idx DESC LIMIT 1
            ) AS r ON true
        """
        # The frontiers of a batch's workspaces read back (another node grew their trees, or
        # the cache was evicted), all in one read-only round trip under the write lock: the
        # hashes at the (workspace, index) pairs of $3/$4 (all below their workspace's stored
        # count), and a row (want -1) for each (workspace, stored count) of $1/$2 whose
        # stored hashes go past that count: a run from the count on, or the last run before it
        # reaching across it (left by a log cut behind the store's back; dropped and cut by
        # drop_stale_hashes, only then). Two index probes per workspace: the drop and the cut
        # written into every read-back cost a shared workspace's writers more than half their
        # appends (docs/operations.md, "Measured").
        self.load_frontiers = f"""
            SELECT w.workspace, w.want,
                   substring(r.hash FROM ((w.want - r.idx) * 32 + 1)::int FOR 32)
            FROM unnest($3::text[], $4::bigint[]) AS w(workspace, want)
            JOIN LATERAL (
                SELECT idx, hash FROM {s}.merkle_hashes
                WHERE workspace = w.workspace AND idx <= w.want ORDER BY idx DESC LIMIT 1
            ) AS r ON true
            UNION ALL
            SELECT t.workspace, -1::bigint, NULL::bytea
            FROM unnest($1::text[], $2::bigint[]) AS t(workspace, count)
            WHERE EXISTS (
                SELECT 1 FROM {s}.merkle_hashes
                WHERE workspace = t.workspace AND idx >= t.count
            ) OR EXISTS (
                SELECT 1 FROM (
                    SELECT idx, hash FROM {s}.merkle_hashes
                    WHERE workspace = t.workspace AND idx < t.count ORDER BY idx DESC LIMIT 1
                ) AS last
                WHERE last.idx + octet_length(last.hash) / 32 > t.count
            )
        """
        # For each (workspace, stored count) of $1/$2: drop the stored hashes from the count
        # on and cut the run across it (stale derived data: see load_frontiers).
        self.drop_stale_hashes = f"""
            WITH tip AS (
                SELECT * FROM unnest($1::text[], $2::bigint[]) AS t(workspace, count)
            ), gone AS (
                DELETE FROM {s}.merkle_hashes AS m USING tip
                WHERE m.workspace = tip.workspace AND m.idx >= tip.count
            )
            UPDATE {s}.merkle_hashes AS m
            SET hash = substring(m.hash FROM 1 FOR ((tip.count - m.idx) * 32)::int)
            FROM tip
            WHERE m.workspace = tip.workspace AND m.idx < tip.count
              AND m.idx + octet_length(m.hash) / 32 > tip.count
        """
        self.delete_hashes_from = (
            f"DELETE FROM {s}.merkle_hashes WHERE workspace = $1 AND idx >= $2"
        )
        self.head_seq = f"SELECT seq FROM {s}.heads WHERE workspace = $1"
        self.save_checkpoint = (
            f"INSERT INTO {s}.checkpoints (workspace, size, note, cosignatures) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT (workspace, size) DO NOTHING"
        )
        self.set_cosignatures = (
            f"UPDATE {s}.checkpoints SET cosignatures = $3 WHERE workspace = $1 AND size = $2"
        )
        self.checkpoint = (
            f"SELECT workspace, size, note, cosignatures FROM {s}.checkpoints "
            "WHERE workspace = $1 AND size = $2"
        )
        self.latest_checkpoint = (
            f"SELECT workspace, size, note, cosignatures FROM {s}.checkpoints "
            "WHERE workspace = $1 ORDER BY size DESC LIMIT 1"
        )
        self.checkpoints = (
            f"SELECT workspace, size, note, cosignatures FROM {s}.checkpoints "
            "WHERE workspace = $1 ORDER BY size"
        )
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
        # Each event past $1 and whether it is below the horizon (docs/operations.md,
        # "Ordering"), of this statement's one snapshot: written before migration 10 (no
        # tx); or by a transaction older than every one still running (below xmin); or
        # restored from another cluster (a tx at or past xmax: a transaction of this one
        # that committed is below it, and the rest are not visible).
        self.all = f"""
            WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s)
            SELECT e.position, e.body,
                   e.tx IS NULL OR e.tx < pg_snapshot_xmin(snap.s)
                   OR e.tx >= pg_snapshot_xmax(snap.s)
            FROM {s}.events AS e, snap
            WHERE e.position > $1 ORDER BY e.position LIMIT $2
        """
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
        # A blob stored again is touched: its stored_at moves strictly forward, past the
        # stamp of the intent storing it (whatever the clocks of the nodes say), so the
        # orphan sweep never takes a blob used since (hub.log.base.BlobIntent). $3: that
        # stamp, in microseconds since the epoch, or NULL (then now()).
        self.blob_put = (
            f"INSERT INTO {s}.blobs AS b (sha256, data, size, stored_at) "
            "VALUES ($1, $2::bytea, octet_length($2::bytea), "
            "coalesce(timestamptz 'epoch' + $3::bigint * interval '1 microsecond', now())) "
            f"ON CONFLICT (sha256) DO UPDATE SET stored_at = {_TOUCHED.format(b='b', at='$3')}"
        )
        self.blob_touch = (
            f"UPDATE {s}.blobs AS b SET stored_at = {_TOUCHED.format(b='b', at='NULL')} "
            "WHERE sha256 = $1"
        )
        self.intent_put = (
            f"INSERT INTO {s}.blob_intents (workspace, event_id, sha256, size, stamp) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (workspace, event_id, sha256) "
            "DO UPDATE SET size = EXCLUDED.size, stamp = EXCLUDED.stamp, "
            "written_at = clock_timestamp()"
        )
        # $1: the stamp bound (the caller's clock); $2: the age that bound stands for, in
        # microseconds, measured on the database's clock (written_at): a node whose clock is
        # behind stamps its intents in the past, and they must still get their grace.
        self.intent_list = (
            f"SELECT workspace, event_id, sha256, size, stamp FROM {s}.blob_intents "
            "WHERE stamp < $1 AND written_at < clock_timestamp() - $2::bigint * "
            "interval '1 microsecond'"
        )
        self.intent_drop = (
            f"DELETE FROM {s}.blob_intents WHERE workspace = $1 AND event_id = $2 AND sha256 = $3"
        )
        self.blob_delete_untouched = (
            f"DELETE FROM {s}.blobs WHERE sha256 = $1 "
            "AND stored_at <= timestamptz 'epoch' + $2::bigint * interval '1 microsecond'"
        )
        self.blob_get = f"SELECT data FROM {s}.blobs WHERE sha256 = $1"
        self.blob_has = f"SELECT EXISTS (SELECT 1 FROM {s}.blobs WHERE sha256 = $1)"
        self.blob_meta = (
            f"SELECT chunked, coalesce(size, octet_length(data)) FROM {s}.blobs WHERE sha256 = $1"
        )
        self.blob_substring = (
            f"SELECT substring(data FROM $2 FOR $3) FROM {s}.blobs WHERE sha256 = $1"
        )
        self.blob_parts = (
            f"SELECT off, data FROM {s}.blob_parts WHERE sha256 = $1 AND off < $3 "
            "AND off + octet_length(data) > $2 ORDER BY off"
        )
        self.blob_all_parts = f"SELECT off, data FROM {s}.blob_parts WHERE sha256 = $1 ORDER BY off"
        # $1 sha256, $2 size, then the uploader (the last parameter).
        self.upload_held = (
            f"SELECT coalesce(max(off + octet_length(data)), 0) FROM {s}.blob_uploads "
            "WHERE sha256 = $1 AND size = $2 AND uploader = $3"
        )
        self.upload_write = (
            f"INSERT INTO {s}.blob_uploads AS u (sha256, size, off, data, uploader) "
            "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (uploader, sha256, size, off) DO UPDATE SET "
            "data = EXCLUDED.data, written_at = now() "
            "WHERE octet_length(EXCLUDED.data) >= octet_length(u.data)"
        )
        self.upload_parts = (
            f"SELECT off, data FROM {s}.blob_uploads WHERE sha256 = $1 AND size = $2 "
            "AND uploader = $3 ORDER BY off"
        )
        self.upload_move = (
            f"INSERT INTO {s}.blob_parts (sha256, off, data) SELECT sha256, off, data "
            f"FROM {s}.blob_uploads WHERE sha256 = $1 AND size = $2 AND uploader = $3 "
            "ON CONFLICT DO NOTHING"
        )
        self.upload_drop = (
            f"DELETE FROM {s}.blob_uploads WHERE sha256 = $1 AND size = $2 AND uploader = $3"
        )
        # Writers and the committer of one upload take this lock in their transaction: the
        # commit hashes and copies the chunks with no write between.
        self.upload_lock = "SELECT pg_advisory_xact_lock(hashtext($1 || '.' || $2 || '.' || $3))"
        self.grant_put = (
            f"INSERT INTO {s}.blob_grants (workspace, sha256, size, agent) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
        )
        self.grant_of = f"SELECT sha256, size FROM {s}.blob_grants WHERE workspace = $1"
        self.grant_list = (
            f"SELECT workspace, sha256, extract(epoch FROM granted_at) FROM {s}.blob_grants"
        )
        self.grant_drop = f"DELETE FROM {s}.blob_grants WHERE workspace = $1 AND sha256 = $2"
        # $3: as in blob_put (an intent's stamp, or NULL).
        self.blob_put_chunked = (
            f"INSERT INTO {s}.blobs AS b (sha256, data, size, chunked, stored_at) "
            "VALUES ($1, ''::bytea, $2, true, "
            "coalesce(timestamptz 'epoch' + $3::bigint * interval '1 microsecond', now())) "
            f"ON CONFLICT (sha256) DO UPDATE SET stored_at = {_TOUCHED.format(b='b', at='$3')}"
        )
        self.blob_delete = f"DELETE FROM {s}.blobs WHERE sha256 = $1"
        self.upload_purge = (
            f"DELETE FROM {s}.blob_uploads u WHERE (u.uploader, u.sha256, u.size) IN "
            f"(SELECT uploader, sha256, size FROM {s}.blob_uploads GROUP BY uploader, sha256, size "
            "HAVING max(written_at) < to_timestamp($1))"
        )
        self.upload_count = (
            f"SELECT count(*) FROM (SELECT 1 FROM {s}.blob_uploads "
            "GROUP BY uploader, sha256, size "
            "HAVING max(written_at) < to_timestamp($1)) AS stale"
        )
        self.blob_delete_parts = f"DELETE FROM {s}.blob_parts WHERE sha256 = $1"
        self.blob_list = (
            f"SELECT sha256, coalesce(size, octet_length(data)), extract(epoch FROM stored_at) "
            f"FROM {s}.blobs"
        )


def _hash_map(rows: list[asyncpg.Record]) -> dict[int, bytes]:
    """(index, 32-byte slice) rows as index → hash; a short slice is a hash not stored."""
    return {int(r[0]): bytes(r[1]) for r in rows if r[1] is not None and len(r[1]) == HASH_SIZE}


def _checkpoint(row: asyncpg.Record) -> CheckpointRecord:
    return CheckpointRecord(
        workspace=row[0], size=int(row[1]), note=str(row[2]), cosignatures=str(row[3])
    )


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

    async def put(self, data: bytes, *, stamp: int | None = None) -> str:
        """Store ``data``; return its sha256. Idempotent (a stored blob is touched; a new one
        is stored at ``stamp``, in microseconds, when given). Raises :class:`TooLarge` above
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
            await self._pool().execute(self._sql.blob_put, digest, data, stamp)
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
        if not data:  # a chunked blob keeps its content in blob_parts
            # In ranges, hashed as they come (in a worker thread): never a query result of
            # the whole blob beside the copy returned.
            total = await self.size(sha256)
            out = bytearray()
            digest = hashlib.sha256()
            while len(out) < total:
                part = await self.read(sha256, len(out), _HASH_BATCH)
                if not part:
                    break
                await asyncio.to_thread(digest.update, part)
                out += part
            if len(out) != total or digest.hexdigest() != sha256:
                raise IntegrityError(f"blob {sha256} does not match its hash", sha256=sha256)
            return bytes(out)
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

    # -- streaming -----------------------------------------------------------------------

    async def _meta(self, sha256: str) -> tuple[bool, int]:
        self._check(sha256)
        try:
            row = await self._pool().fetchrow(self._sql.blob_meta, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "looking up a blob") from e
        if row is None:
            raise NotFound(f"blob {sha256} not found", sha256=sha256)
        return bool(row[0]), int(row[1])

    async def size(self, sha256: str) -> int:
        return (await self._meta(sha256))[1]

    async def read(self, sha256: str, offset: int, length: int) -> bytes:
        chunked, total = await self._meta(sha256)
        if offset < 0 or offset > total:
            raise BadRequest(
                f"offset {offset} is beyond the blob's {total} bytes", field="$.offset"
            )
        end = min(total, offset + max(0, length))
        if end <= offset:
            return b""
        try:
            if not chunked:
                data = await self._pool().fetchval(
                    self._sql.blob_substring, sha256, offset + 1, end - offset
                )
                return bytes(data or b"")
            rows = await self._pool().fetch(self._sql.blob_parts, sha256, offset, end)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "reading a blob") from e
        return _stitch(((int(r[0]), bytes(r[1])) for r in rows), offset, end)

    async def upload_offset(self, sha256: str, size: int, *, uploader: str = "") -> int:
        self._check(sha256)
        self._check_size(size)
        if not uploader and await self.has(sha256):
            return size  # the hub's own content: nothing to prove
        try:
            return int(await self._pool().fetchval(self._sql.upload_held, sha256, size, uploader))
        except _DRIVER_ERRORS as e:
            raise _translate(e, "reading an upload") from e

    async def write_chunk(
        self, sha256: str, size: int, offset: int, data: bytes, *, uploader: str = ""
    ) -> int:
        self._check(sha256)
        self._check_size(size)
        if offset < 0 or offset + len(data) > size:
            raise BadRequest(
                f"a chunk at {offset} of {len(data)} bytes does not fit a blob of {size}",
                field="$.offset",
            )
        try:
            async with self._pool().acquire() as conn, conn.transaction():
                await conn.execute(self._sql.upload_lock, sha256, str(size), uploader)
                held = int(await conn.fetchval(self._sql.upload_held, sha256, size, uploader))
                if offset > held:
                    raise BadRequest(
                        f"chunk at {offset} leaves a gap: the upload holds {held} bytes",
                        field="$.offset",
                        offset=held,
                    )
                if data:
                    await conn.execute(
                        self._sql.upload_write, sha256, size, offset, bytes(data), uploader
                    )
                return max(held, offset + len(data))
        except _DRIVER_ERRORS as e:
            raise _translate(e, "writing an upload") from e

    async def commit(
        self, sha256: str, size: int, *, uploader: str = "", stamp: int | None = None
    ) -> None:
        self._check(sha256)
        if not uploader and await self.touch(sha256):
            return
        digest = hashlib.sha256()
        try:
            async with self._pool().acquire() as conn, conn.transaction():
                # Hash and copy in this one transaction, no writer between (upload_lock).
                await conn.execute(self._sql.upload_lock, sha256, str(size), uploader)
                at = 0
                # A cursor: the upload's chunks stream through, a batch at a time, hashed in
                # a worker thread (megabytes of CPU work stay off the event loop).
                batch: list[bytes] = []
                held = 0
                async for row in conn.cursor(self._sql.upload_parts, sha256, size, uploader):
                    off, part = int(row[0]), bytes(row[1])
                    if off > at:
                        break  # a gap (cannot happen through write_chunk)
                    fresh = part[at - off :]
                    batch.append(fresh)
                    held += len(fresh)
                    at += len(fresh)
                    if held >= _HASH_BATCH:
                        await asyncio.to_thread(_update, digest, batch)
                        batch, held = [], 0
                if batch:
                    await asyncio.to_thread(_update, digest, batch)
                if at != size:
                    raise BadRequest(
                        f"the upload holds {at} of {size} bytes; send the rest first",
                        field="$.sha256",
                        offset=at,
                    )
                if digest.hexdigest() != sha256:
                    await conn.execute(self._sql.upload_drop, sha256, size, uploader)
                else:
                    await conn.execute(self._sql.upload_move, sha256, size, uploader)
                    await conn.execute(self._sql.blob_put_chunked, sha256, size, stamp)
                    await conn.execute(self._sql.upload_drop, sha256, size, uploader)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "committing a blob") from e
        if digest.hexdigest() != sha256:
            raise BadRequest(
                f"the uploaded content does not hash to {sha256}; upload discarded",
                field="$.sha256",
                actual=digest.hexdigest(),
            )

    # -- grants ---------------------------------------------------------------------------

    async def grant(self, workspace: str, sha256: str, size: int, agent: str) -> None:
        self._check(sha256)
        try:
            await self._pool().execute(self._sql.grant_put, workspace, sha256, size, agent)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "recording a grant") from e

    async def grants(self, workspace: str) -> dict[str, int]:
        try:
            rows = await self._pool().fetch(self._sql.grant_of, workspace)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "reading grants") from e
        return {str(r[0]): int(r[1]) for r in rows}

    async def list_grants(self) -> AsyncIterator[tuple[str, str, float]]:
        try:
            rows = await self._pool().fetch(self._sql.grant_list)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "listing grants") from e
        for row in rows:
            yield str(row[0]), str(row[1]), float(row[2])

    async def revoke(self, workspace: str, sha256: str) -> bool:
        self._check(sha256)
        try:
            status = await self._pool().execute(self._sql.grant_drop, workspace, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "dropping a grant") from e
        return _rowcount(status) > 0

    async def delete(self, sha256: str) -> bool:
        self._check(sha256)
        try:
            async with self._pool().acquire() as conn, conn.transaction():
                status = await conn.execute(self._sql.blob_delete, sha256)
                await conn.execute(self._sql.blob_delete_parts, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "deleting a blob") from e
        return _rowcount(status) > 0

    async def purge_uploads(self, before: float) -> int:
        try:
            async with self._pool().acquire() as conn, conn.transaction():
                n = int(await conn.fetchval(self._sql.upload_count, before))
                await conn.execute(self._sql.upload_purge, before)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "purging uploads") from e
        return n

    # -- intents --------------------------------------------------------------------------

    async def touch(self, sha256: str) -> bool:
        self._check(sha256)
        try:
            status = await self._pool().execute(self._sql.blob_touch, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "touching a blob") from e
        return _rowcount(status) > 0

    async def intend(self, workspace: str, event_id: str, sha256: str, size: int) -> BlobIntent:
        self._check(sha256)
        intent = BlobIntent(workspace, event_id, sha256, size, time.time_ns() // 1000)
        try:
            await self._pool().execute(
                self._sql.intent_put, workspace, event_id, sha256, size, intent.stamp
            )
        except _DRIVER_ERRORS as e:
            raise _translate(e, "recording a blob intent") from e
        return intent

    async def intents(self, before: float) -> tuple[BlobIntent, ...]:
        try:
            # The age ``before`` stands for on this node's clock (negative for a bound in the
            # future: every intent), clamped to what an interval holds.
            age = min(max((time.time() - before) * 1_000_000, -1e15), 1e15)
            rows = await self._pool().fetch(self._sql.intent_list, stamp_before(before), int(age))
        except _DRIVER_ERRORS as e:
            raise _translate(e, "listing blob intents") from e
        return tuple(
            BlobIntent(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4])) for r in rows
        )

    async def settle(self, intent: BlobIntent) -> None:
        try:
            await self._pool().execute(
                self._sql.intent_drop, intent.workspace, intent.event_id, intent.sha256
            )
        except _DRIVER_ERRORS as e:
            raise _translate(e, "dropping a blob intent") from e

    async def delete_untouched(self, sha256: str, stamp: int) -> bool:
        self._check(sha256)
        try:
            async with self._pool().acquire() as conn, conn.transaction():
                status = await conn.execute(self._sql.blob_delete_untouched, sha256, stamp)
                removed = _rowcount(status) > 0
                if removed:
                    await conn.execute(self._sql.blob_delete_parts, sha256)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "deleting a blob") from e
        return removed

    async def list(self) -> AsyncIterator[tuple[str, int, float]]:
        try:
            rows = await self._pool().fetch(self._sql.blob_list)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "listing blobs") from e
        for row in rows:
            yield str(row[0]), int(row[1]), float(row[2])


def _stitch(parts: Iterable[tuple[int, bytes]], start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of a blob from its chunks (ordered by offset, possibly
    overlapping where an upload was resumed with another chunk size)."""
    out = bytearray()
    at = start
    for off, data in parts:
        if off > at or at >= end:
            break
        piece = data[at - off : end - off]
        out += piece
        at += len(piece)
    return bytes(out)


_HASH_BATCH: Final = 4 * 1024 * 1024
"""Bytes of an upload hashed per worker-thread call while it is committed."""


def _update(digest: hashlib._Hash, parts: list[bytes]) -> None:
    for part in parts:
        digest.update(part)


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


CARRY_MAX: Final = 7900
"""Bytes of a notification's payload, at most, including the events it carries. PostgreSQL
refuses payloads of 8000 bytes or more (its default build); a commit whose events of one
workspace do not fit sends the bare hint, and the listeners read them back."""


def notifications(
    rows: Sequence[tuple[Event, bytes]], workspaces: Sequence[str], tips: Sequence[Tip]
) -> list[str]:
    """One payload per workspace written (see the module docstring, "NOTIFY"): each
    ``<workspace>:<seq>``, with ``:[body,…]`` when the commit's events of it fit."""
    bodies: dict[str, list[bytes]] = {}
    for event, body in rows:
        bodies.setdefault(event.workspace, []).append(body)
    payloads: list[str] = []
    for workspace, tip in zip(workspaces, tips, strict=True):
        hint = f"{workspace}:{tip[0]}"
        carried = bodies.get(workspace)
        if carried:
            size = len(hint) + 3 + sum(len(b) + 1 for b in carried)
            if size <= CARRY_MAX:
                # Stored bodies are UTF-8 JSON (encode_event): text as they are.
                hint += ":[" + b",".join(carried).decode() + "]"
        payloads.append(hint)
    return payloads


def parse_notification(payload: str) -> tuple[str, int, bytes | None] | None:
    """(workspace, head, carried events or None) of a payload of :func:`notifications`, or
    None for one that is not (ignored: another program's NOTIFY on the channel). A
    workspace name holds no ``:``, so the first two separate the parts."""
    workspace, sep, rest = payload.partition(":")
    seq, more, carried = rest.partition(":")
    if not sep or not seq.isdigit():
        return None
    return workspace, int(seq), carried.encode() if more and carried else None


class PostgresEventStore(EventStore):
    """The PostgreSQL :class:`EventStore` (see the module docstring for the design).

    ``dsn``: a libpq-style URL or DSN for asyncpg. ``schema``: the PostgreSQL schema holding the
    tables (created if absent; one schema per independent hub). ``blobs``: where blobs live
    (default: a :class:`PostgresBlobStore` in the same schema). ``pool_size``: connections for
    everything but appending events (reads, blobs, checkpoints, snapshots; the event writer
    keeps one of its own). ``migrate``: apply missing schema migrations on ``open`` (else
    ``open`` refuses an old schema). ``batch_max``: the most events one group commit writes (a
    larger single request is written alone). ``queue_max``: the most requests waiting for the
    writer (one ``append_many`` call counts once); ``append`` then waits for room.
    ``lock_timeout``: seconds to wait for a workspace's write lock held by another node before
    failing with :class:`Unavailable`. ``channel``: the NOTIFY channel (default
    ``<schema>_events``, so ``agora_events``).
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
        self._timeout = f"SET LOCAL lock_timeout = {int(lock_timeout * 1000)}"
        self._begin = f"BEGIN ISOLATION LEVEL READ COMMITTED; {self._timeout}; {self._sql.lock}"
        self._writer: Conn | None = None  # the writer's own connection (_writer_connection)
        self._pool: Pool | None = None
        self._commits = GroupCommit(
            batch_max=batch_max,
            queue_max=queue_max,
            storable=_storable,
            workspaces_max=BATCH_WORKSPACES_MAX,
        )
        self._last_timestamp = 0
        # Frontiers of the workspaces this node wrote, keyed by their chain head: reused only
        # while the head read under the lock is still theirs (other nodes append too).
        self._trees: dict[str, TreeTip] = {}

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
        if self._commits.task is not None:
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
        self._commits.start(self._commit, name=f"agora-writer:{self.schema}")

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
        await self._commits.close(self._release)

    async def _release(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                async with asyncio.timeout(self.command_timeout):
                    await writer.close()
            except (TimeoutError, *_DRIVER_ERRORS):
                writer.terminate()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                async with asyncio.timeout(self.command_timeout):
                    await pool.close()  # waits for readers to give their connections back
            except (TimeoutError, *_DRIVER_ERRORS):
                pool.terminate()

    # -- following other nodes --------------------------------------------------------------

    async def follow(self, notify: CommitHint, *, resumed: Callable[[], None]) -> None:
        """See :meth:`EventStore.follow`: LISTEN on :attr:`channel` over a dedicated
        connection (not one of the pool's, so a busy pool never delays the hints).

        Every ``FOLLOW_KEEPALIVE_S`` the connection is checked with a query; a lost one is
        reopened with exponential backoff (``FOLLOW_BACKOFF``), and ``resumed()`` is called
        once LISTEN is active again (so nothing committed after that can be missed). Runs
        until cancelled; never raises a database error.
        """
        failures = 0

        def hint(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            parsed = parse_notification(str(payload))
            if parsed is not None:
                notify(*parsed)

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
                failures = 0
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
                    "LISTEN %s: %s; reconnecting",
                    self.channel,
                    _translate(e, "following the log").message,
                )
            finally:
                if conn is not None:
                    conn.terminate()
            await asyncio.sleep(FOLLOW_BACKOFF.delay(failures))
            failures += 1

    # -- the writer task (hub.log.writer.GroupCommit) calls this with each batch ------------

    async def _commit(self, batch: list[WriteRequest]) -> None:
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
            self._commits.settle(live, outcomes)
            raise
        self._commits.settle(live, outcomes)

    async def _transact(self, batch: list[WriteRequest]) -> list[WriteOutcome]:
        """Write one batch in one transaction; one outcome per request, in order."""
        try:
            conn = await self._begun({r.workspace for r in batch})
            try:
                decision, now = await self._decide(conn, batch)
                trees: dict[str, TreeTip] = {}
                if decision.rows:
                    hash_rows, trees = grow_trees(
                        decision.growth,
                        await self._trees_of(conn, decision.growth),
                        decision.staged,
                    )
                    await self._write(conn, decision.rows, decision.staged, hash_rows)
                await conn.execute("COMMIT")
            except BaseException:
                await self._roll_back(conn)
                raise
        except _DRIVER_ERRORS as e:
            error = _translate(e, "committing a batch")
            message = f"could not commit the batch: {error.message}"
            return [chain(type(error)(message, **error.details), e) for _ in batch]
        except AgoraError as e:
            return [e for _ in batch]
        except Exception as e:  # a bug: fail this batch only, keep the writer alive
            return [chain(Internal(f"writer failed: {e!r}"), e) for _ in batch]
        self._last_timestamp = max(self._last_timestamp, now)
        if len(self._trees) > _MAX_CACHED_TREES:
            self._trees.clear()  # bounded: evicted frontiers are read back on demand
        self._trees.update(trees)
        return decision.outcomes

    async def _writer_connection(self) -> Conn:
        """The writer's own connection, opened on first use and again after one is lost.
        Not one of the pool's: a pooled connection runs asyncpg's reset query (a round trip)
        each time it is given back, once per batch, and a pool of one stays the readers'."""
        if self._writer is None or self._writer.is_closed():
            self._get_pool()  # refuses a store that is not open
            self._writer = await asyncpg.connect(self.dsn, command_timeout=self.command_timeout)
        return self._writer

    def _locks(self, workspaces: Iterable[str]) -> str:
        """The statements that take the write locks of ``workspaces``, one transaction
        advisory lock each, in key order (two batches locking the same workspaces never wait
        for each other in a cycle). A key is 64 bits of a hash of schema and workspace: two
        workspaces sharing one only wait for each other. Integers: safe in the text."""
        return "; ".join(
            f"SELECT pg_advisory_xact_lock({key})"
            for key in sorted({workspace_lock_key(self.schema, w) for w in workspaces})
        )

    async def _begun(self, workspaces: Collection[str]) -> Conn:
        """The writer's connection, in a transaction holding the write locks of the batch's
        ``workspaces``: BEGIN, the locks' timeout, the table's ROW EXCLUSIVE lock and the
        workspaces' locks in one round trip (the simple query protocol takes several
        statements); then come the positions with the heads, the ids already stored, the rows
        and COMMIT. A connection found lost here (the server restarted, an operator ended it)
        is replaced once: nothing of the batch was sent yet."""
        begin = f"{self._begin}; {self._locks(workspaces)}"
        conn = await self._writer_connection()
        try:
            await conn.execute(begin)
        except Exception as e:
            if not _connection_lost(e):
                await self._roll_back(conn)
                raise  # the lock timed out, or the server refused: not the connection
            conn.terminate()
            self._writer = None
            conn = await self._writer_connection()
            try:
                await conn.execute(begin)
            except BaseException:
                await self._roll_back(conn)
                raise
        return conn

    async def _roll_back(self, conn: Conn) -> None:
        """End a failed batch's transaction. A connection that cannot is dropped (the next
        batch opens another), so no batch ever begins inside a broken transaction."""
        try:
            if not conn.is_closed() and conn.is_in_transaction():
                # (And any session lock left: take_positions lets go of its own even when
                # it fails, so this is a second line only.)
                await conn.execute("ROLLBACK; SELECT pg_advisory_unlock_all()")
        except Exception:  # any: asyncpg may not know yet that the server is gone
            conn.terminate()
        if self._writer is conn and conn.is_closed():
            self._writer = None

    async def _trees_of(self, conn: Conn, records: dict[str, TreeGrowth]) -> dict[str, TreeTip]:
        """The tree each written workspace grows from: cached, else its frontier read back
        (every such workspace of the batch in one statement), else rebuilt from the events
        (under the batch's lock)."""
        trees: dict[str, TreeTip] = {}
        stale: list[tuple[str, TreeGrowth]] = []
        for workspace, growth in records.items():
            tree = self._trees.get(workspace)
            if tree is not None and tree.matches(growth.size, growth.head):
                trees[workspace] = tree
            else:
                stale.append((workspace, growth))
        if stale:
            trees.update(await self._load_trees(conn, stale))
        return trees

    async def _load_trees(
        self, conn: Conn, stale: list[tuple[str, TreeGrowth]]
    ) -> dict[str, TreeTip]:
        # Stored hashes past a head are stale derived data (the log was cut behind the
        # store's back): dropped rather than left to collide with new ones.
        wanted = {w: frontier_indexes(g.size) if g.size else [] for w, g in stale}
        counts = {w: stored_hash_count(g.size) for w, g in stale}
        rows = await conn.fetch(
            self._sql.load_frontiers,
            list(counts),
            list(counts.values()),
            [w for w, indexes in wanted.items() for _ in indexes],
            [i for indexes in wanted.values() for i in indexes],
        )
        found: dict[str, dict[int, bytes]] = {w: {} for w, _ in stale}
        past: list[str] = []
        for row in rows:
            if row[1] == -1:
                past.append(row[0])
            elif row[2] is not None and len(row[2]) == HASH_SIZE:
                found[row[0]][int(row[1])] = bytes(row[2])
        if past:
            # (The hashes read above are below each count: the cut leaves them as they are.)
            await conn.execute(self._sql.drop_stale_hashes, past, [counts[w] for w in past])
        trees: dict[str, TreeTip] = {}
        for workspace, growth in stale:
            if growth.size == 0:
                trees[workspace] = EMPTY_TREE
                continue
            hashes = found[workspace]
            indexes = wanted[workspace]
            if all(i in hashes for i in indexes):
                trees[workspace] = TreeTip(
                    growth.size, growth.head, tuple(hashes[i] for i in indexes)
                )
                continue
            tip = await self._rebuild(conn, workspace, growth.size)
            assert tip.head == growth.head, "bad math: rebuilt tree is of another head"
            trees[workspace] = tip
        return trees

    async def _rebuild(self, conn: Conn, workspace: str, size: int) -> TreeTip:
        """Rewrite the stored hashes of events 1..size from the events (in a transaction)."""
        await conn.execute(self._sql.delete_hashes_from, workspace, 0)
        builder = TreeBuilder(workspace)
        after = 0
        while after < size:
            page = await conn.fetch(self._sql.range, workspace, after, size, _REBUILD_PAGE)
            if not page:
                break
            events = decode_page([r[1] for r in page], [r[0] for r in page], "seq")
            rows = builder.add(events)
            await conn.execute(
                self._sql.insert_hashes,
                [r[0] for r in rows],
                [r[1] for r in rows],
                [r[2] for r in rows],
            )
            after = events[-1].seq
        return builder.tip

    async def _write(
        self,
        conn: Conn,
        rows: list[tuple[Event, bytes]],
        staged: dict[str, Tip],
        hash_rows: list[HashRow],
    ) -> None:
        workspaces = list(staged)
        tips = [staged[w] for w in workspaces]
        await conn.fetchval(
            self._sql.write,
            *_columns(rows),
            workspaces,
            [t[0] for t in tips],
            [t[1] for t in tips],
            [t[2] for t in tips],
            [t[3] for t in tips],
            self.channel,
            notifications(rows, workspaces, tips),
            [r[0] for r in hash_rows],
            [r[1] for r in hash_rows],
            [r[2] for r in hash_rows],
        )

    async def _decide(self, conn: Conn, batch: list[WriteRequest]) -> tuple[Decision, int]:
        """Check and seal every request of the batch in memory (:func:`decide_batch`), holding the
        lock. Returns the decision and the batch's timestamp."""
        # A block for every event the batch may write (a refused request's stay unused).
        size = sum(r.size for r in batch)
        found = await conn.fetch(self._sql.tips, sorted({r.workspace for r in batch}), size)
        tips: dict[str, Tip] = {
            r["workspace"]: (r["seq"], r["hash"], r["position"], r["timestamp"])
            for r in found
            if r["workspace"] is not None
        }
        # This node's timestamps never step back (as in the SQLite store).
        now = batch_timestamp(self._last_timestamp)
        since = await self._kinds_since(conn, batch, tips)
        decision = decide_batch(
            batch,
            tip=lambda workspace: tips.get(workspace, EMPTY_TIP),
            known=await self._known_ids(conn, batch),
            position=int(found[0]["first"]),
            now=now,
            mint=mint_ids,  # time-ordered: 64 writers 1.12-1.17x over uuid4 (ids.py)
            tree=True,
            kinds_since=lambda workspace, seq: [
                kind for kind, last in since.get(workspace, {}).items() if last > seq
            ],
        )
        return decision, now

    async def _kinds_since(
        self, conn: Conn, batch: list[WriteRequest], tips: dict[str, Tip]
    ) -> dict[str, dict[str, int]]:
        """Per workspace, the last seq of each kind stored past the earliest ``expected_seq``
        of the batch's requests that name ``reads`` and that the head has passed (under the
        lock, so what decide_batch checks is what the batch lands after); empty when no
        request needs it (the common case: no query)."""
        after: dict[str, int] = {}
        for req in batch:
            if isinstance(req, Append) and req.reads is not None and req.expected_seq is not None:
                head = tips.get(req.workspace, EMPTY_TIP)[0]
                if req.expected_seq < head:
                    after[req.workspace] = min(after.get(req.workspace, head), req.expected_seq)
        if not after:
            return {}
        since: dict[str, dict[str, int]] = {}
        for row in await conn.fetch(self._sql.kinds_since, list(after), list(after.values())):
            since.setdefault(row[0], {})[row[1]] = int(row[2])
        return since

    async def _known_ids(
        self, conn: Conn, batch: list[WriteRequest]
    ) -> dict[tuple[str, str], tuple[int, bytes]]:
        """Client-chosen ids of this batch already stored: (workspace, id) → (seq, body)."""
        workspaces: list[str] = []
        ids: list[str] = []
        for req in batch:
            if isinstance(req, Append):
                for id_ in req.client_ids:
                    workspaces.append(req.workspace)
                    ids.append(id_)
        if not ids:
            return {}
        rows = await conn.fetch(self._sql.known_ids, workspaces, ids)
        return {(r["workspace"], r["id"]): (r["seq"], bytes(r["body"])) for r in rows}

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

    async def import_events(self, workspace: str, events: Sequence[Event]) -> int:
        """See :meth:`EventStore.import_events`."""
        return await self._commits.import_events(workspace, events)

    # -- the Merkle tree and checkpoints ----------------------------------------------------

    async def read_hash_map(self, workspace: str, indexes: Sequence[int]) -> dict[int, bytes]:
        """See :meth:`EventStore.read_hash_map`. Raises ``Unavailable``."""
        if not indexes or not _storable(workspace):
            return {}
        rows = await self._fetch(
            self._sql.hashes, (workspace, list(indexes)), "reading Merkle hashes"
        )
        return _hash_map(rows)

    async def rebuild_hashes(self, workspace: str) -> int:
        """See :meth:`EventStore.rebuild_hashes`: under the workspace's write lock, so no node
        appends to it meanwhile."""
        if not _storable(workspace):
            return 0
        try:
            pool = self._get_pool()
            async with pool.acquire() as conn, conn.transaction(isolation="read_committed"):
                await conn.execute(f"{self._timeout}; {self._sql.lock}; {self._locks([workspace])}")
                size = int(await conn.fetchval(self._sql.head_seq, workspace) or 0)
                tip = await self._rebuild(conn, workspace, size)
        except _DRIVER_ERRORS as e:
            raise _translate(e, "rebuilding the Merkle hashes") from e
        self._trees[workspace] = tip
        return size

    async def save_checkpoint(self, record: CheckpointRecord) -> bool:
        """See :meth:`EventStore.save_checkpoint`."""
        status = await self._execute(
            self._sql.save_checkpoint,
            (record.workspace, record.size, record.note, record.cosignatures),
            "saving a checkpoint",
        )
        return _rowcount(status) == 1

    async def set_cosignatures(self, workspace: str, size: int, cosignatures: str) -> None:
        """See :meth:`EventStore.set_cosignatures`."""
        status = await self._execute(
            self._sql.set_cosignatures, (workspace, size, cosignatures), "saving cosignatures"
        )
        if _rowcount(status) != 1:
            raise NotFound(
                f"no checkpoint of {workspace!r} at size {size}", workspace=workspace, size=size
            )

    async def load_checkpoint(
        self, workspace: str, size: int | None = None
    ) -> CheckpointRecord | None:
        """See :meth:`EventStore.load_checkpoint`. Raises ``Unavailable``."""
        if not _storable(workspace):
            return None
        if size is None:
            rows = await self._fetch(
                self._sql.latest_checkpoint, (workspace,), "reading checkpoints"
            )
        else:
            rows = await self._fetch(self._sql.checkpoint, (workspace, size), "reading checkpoints")
        return _checkpoint(rows[0]) if rows else None

    async def list_checkpoints(self, workspace: str) -> list[CheckpointRecord]:
        """See :meth:`EventStore.list_checkpoints`. Raises ``Unavailable``."""
        if not _storable(workspace):
            return []
        rows = await self._fetch(self._sql.checkpoints, (workspace,), "reading checkpoints")
        return [_checkpoint(r) for r in rows]

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
        return decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")

    async def read_joined(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int = 1000,
    ) -> JoinedPage:
        """See :meth:`EventStore.read_joined`: the stored bytes joined, not decoded. Raises
        ``IntegrityError`` for a row nested too deep, ``Unavailable``."""
        if limit <= 0 or not _storable(workspace):
            return JoinedPage(body=b"[]", count=0, last_seq=after_seq)
        until = _MAX_SEQ if until_seq is None else until_seq
        rows = await self._fetch(
            self._sql.range, (workspace, after_seq, until, limit), "reading events"
        )
        return JoinedPage(
            body=join_bodies([r[1] for r in rows], [r[0] for r in rows], "seq"),
            count=len(rows),
            last_seq=rows[-1][0] if rows else after_seq,
        )

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
        settled = next((i for i, r in enumerate(rows) if not r[2]), len(rows))
        rows = rows[:settled]  # up to the horizon: nothing can still commit below it
        return decode_page([r[1] for r in rows], [r[0] for r in rows], "position")

    async def lookup_ids(self, workspace: str, ids: Sequence[str]) -> dict[str, Event]:
        """See :meth:`EventStore.lookup_ids`. Raises ``IntegrityError``, ``Unavailable``."""
        wanted = [i for i in ids if _storable(i)]
        if not wanted or not _storable(workspace):
            return {}
        rows = await self._fetch(self._sql.bodies_by_id, (workspace, wanted), "looking up ids")
        events = decode_page([r[1] for r in rows], [r[0] for r in rows], "seq")
        return {e.id: e for e in events}

    async def head(self, workspace: str) -> Head | None:
        """See :meth:`EventStore.head`. Raises ``Unavailable``."""
        if not _storable(workspace):
            return None
        rows = await self._fetch(self._sql.head, (workspace,), "reading a head")
        return head_from_row(rows[0]) if rows else None

    async def heads(self) -> list[Head]:
        """See :meth:`EventStore.heads` (ordered by workspace name, bytewise). Raises
        ``Unavailable``."""
        return [head_from_row(r) for r in await self._fetch(self._sql.heads, (), "reading heads")]
