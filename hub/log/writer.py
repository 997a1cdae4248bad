"""Group commit, shared by every log store: one writer per store, many appends per transaction.

``append`` and ``import_events`` check their arguments, put a request on a bounded queue and
await its future; ``append_many`` queues several appends' requests contiguously and awaits
them together (one wake-up for a connection's pipelined publishes). One writer task
(:class:`GroupCommit`, owned by the store) drains every queued request, up to ``batch_max``
events (a larger single request is written alone), and hands the batch to the store's
``commit``, which writes it in ONE transaction: one fsync (or one round trip) then covers
every request of the batch.

Inside that transaction the store calls :func:`decide_batch`, which checks and seals every request
in memory against the workspaces' tips (dedup by id, ``expected_seq``, import into an empty
workspace) and returns one outcome per request and the rows to insert: only accepted
requests contribute rows, so one failing request never fails the others of its batch.
:func:`decide_batch` does no I/O; what it needs from the database (the tips, the already-stored
ids) the store looks up, with its own SQL, in its own transaction.

What stays in each store: the SQL, the transaction and its locking, the driver (a thread for
``sqlite3``, asyncio for ``asyncpg``), how a batch reaches it, the translation of the driver's
errors, and how ids are minted. The stores differ there on purpose:

* Tips: SQLite caches them across transactions (one store owns the file; ``PRAGMA
  data_version`` reveals another writer); PostgreSQL reads them in every transaction, under
  the workspaces' write locks, because other hub nodes append too.
* Cancelled callers: PostgreSQL drops the requests whose caller gave up before the
  transaction began (a transaction holds its workspaces' locks for every node) and finishes
  one under way before its cancelled writer task lets go; SQLite hands whole batches to its thread,
  where a transaction cannot be interrupted. Either way the real outcome reaches the callers
  still waiting, and a retry with the same ids answers ``duplicate``.
* Ids: PostgreSQL refuses client ids a TEXT column cannot hold (``storable``); both mint
  time-ordered UUIDv7 (:func:`hub.log.ids.mint_ids`, measured for their indexes).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeAlias

import msgspec

from hub.core.chain import GENESIS, canonical_bytes, seal_canonical, verify_chain
from hub.core.errors import (
    AgoraError,
    BadRequest,
    Conflict,
    IntegrityError,
    Internal,
    Unavailable,
)
from hub.core.events import EVENT_TYPES, Event, encode_event
from hub.core.merkle import extend_canonical, stored_hash_count
from hub.core.records import AppendResult
from hub.core.validation import validate_workspace
from hub.log.base import AppendItem, CommitListener, CommitObserver
from hub.log.codec import decode_page

log = logging.getLogger(__name__)

_KINDS_BY_TYPE: Final[dict[type[Event], str]] = {t: t.kind for t in EVENT_TYPES}

# (seq, hash, position, timestamp) of a workspace's last event.
Tip: TypeAlias = tuple[int, str, int, int]
EMPTY_TIP: Final[Tip] = (0, GENESIS, 0, 0)


class Group:
    """The one settlement the requests of one ``append_many`` call share: one future for
    them all (set once the last one has its outcome, or failed for those left when the
    writer stops) and each request's outcome in its slot. A caller's pipelined publishes then
    cost the loop one future and one wake-up, not one per publish."""

    __slots__ = ("future", "left", "outcomes")

    def __init__(self, future: asyncio.Future[None], count: int) -> None:
        self.future = future
        self.outcomes: list[WriteOutcome | None] = [None] * count
        self.left = count


class Append:
    """One queued ``append`` call (``group``, ``index``: its slot when it is one of an
    ``append_many`` call's, whose requests share ``future``)."""

    __slots__ = (
        "client_ids",
        "drafts",
        "expected_seq",
        "future",
        "group",
        "index",
        "reads",
        "size",
        "workspace",
    )

    def __init__(
        self,
        workspace: str,
        drafts: tuple[Event, ...],
        expected_seq: int | None,
        client_ids: list[str],
        future: asyncio.Future[Any],
        group: Group | None = None,
        index: int = 0,
        reads: frozenset[str] | None = None,
    ) -> None:
        self.workspace = workspace
        self.drafts = drafts
        self.expected_seq = expected_seq
        self.reads = reads
        self.client_ids = client_ids
        self.future = future
        self.group = group
        self.index = index
        self.size = len(drafts)


class Import:
    """One queued ``import_events`` call (events already verified)."""

    __slots__ = ("events", "future", "size", "workspace")

    def __init__(
        self, workspace: str, events: tuple[Event, ...], future: asyncio.Future[Any]
    ) -> None:
        self.workspace = workspace
        self.events = events
        self.future = future
        self.size = len(events)


WriteRequest: TypeAlias = Append | Import
Queued: TypeAlias = WriteRequest | tuple[Append, ...]
"""One entry of the writer's queue: a request, or the requests of one ``append_many`` call
(queued as one entry: contiguous in the log, one queue operation for them all)."""
WriteOutcome: TypeAlias = AppendResult | int | AgoraError
# A store's commit: write the batch in one transaction and settle every request's future.
Commit: TypeAlias = Callable[[list[WriteRequest]], Awaitable[None]]


class _Stop:
    """Wakes the writer task when the store closes."""


_STOP: Final = _Stop()


def chain(error: AgoraError, cause: BaseException) -> AgoraError:
    """``raise error from cause`` for an error handed to a waiting caller's future."""
    error.__cause__ = cause
    return error


def resolve(batch: Sequence[WriteRequest], outcomes: Sequence[WriteOutcome]) -> None:
    """Hand each request its outcome (one per request, in order); skip cancelled callers.
    A request of a :class:`Group` fills its slot; the last one of the group sets the shared
    future."""
    for request, outcome in zip(batch, outcomes, strict=True):
        future = request.future
        if future.done():  # the caller was cancelled
            continue
        if type(request) is Append and (group := request.group) is not None:
            group.outcomes[request.index] = outcome
            group.left -= 1
            if group.left == 0:
                future.set_result(None)
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _as_agora(error: BaseException) -> AgoraError:
    """A request's failure as an outcome of :meth:`GroupCommit.append_many` (the stores only
    settle futures with :class:`AgoraError`; anything else is a bug, reported as internal)."""
    if isinstance(error, AgoraError):
        return error
    return chain(Internal(f"the store failed: {error!r}"), error)


def _any_id(_id: str) -> bool:
    return True


class GroupCommit:
    """The bounded request queue and the one writer task of a store.

    ``storable(id)``: whether the store can hold that client-chosen id (an append or import
    with one it cannot is a :class:`BadRequest`). ``workspaces_max``: the most workspaces
    one batch writes (PostgreSQL takes a lock per workspace, from a server-wide lock table;
    None: any number). Use :meth:`start` once the store's
    resources are open and :meth:`close` to drain: stop taking requests, commit every accepted
    one (including those waiting for room in the queue), then release the store's resources.
    """

    def __init__(
        self,
        *,
        batch_max: int,
        queue_max: int,
        storable: Callable[[str], bool] = _any_id,
        workspaces_max: int | None = None,
    ) -> None:
        self.batch_max = batch_max
        self.queue_max = queue_max
        self.workspaces_max = workspaces_max
        self._storable = storable
        self.task: asyncio.Task[None] | None = None
        self.accepting = False
        self._queue: asyncio.Queue[Queued | _Stop] | None = None
        self._stopping = False
        # Requests waiting for room in the full queue, in call order. The writer moves them
        # into the queue itself as it makes room, so none overtakes another (asyncio.Queue's
        # own put() lets a newcomer take a freed slot before the putter it woke).
        self._backlog: collections.deque[tuple[Queued, asyncio.Future[None]]] = collections.deque()
        self._closing: asyncio.Future[None] | None = None
        # Told (requests, seconds, failed) after each transaction (EventStore.observe_commits).
        self.observer: CommitObserver | None = None
        # Told each transaction's new events before its callers resume (EventStore.hear_commits).
        self.listeners: list[CommitListener] = []

    def settle(self, batch: Sequence[WriteRequest], outcomes: Sequence[WriteOutcome]) -> None:
        """A transaction's outcome (one per request, in order), on the loop: tell the
        listeners the appends it committed, then every caller still waiting
        (:func:`resolve`). Called by the store's ``commit``, once per batch it was handed,
        for a failed transaction too (the listeners then hear nothing). The appends of
        callers that gave up are heard as well: their events are in the log."""
        if self.listeners:
            appended = [
                outcome
                for outcome in outcomes
                if type(outcome) is AppendResult and not outcome.duplicate
            ]
            if appended:
                for listener in self.listeners:
                    try:
                        listener(appended)
                    except Exception:  # a broken listener must not break the writer
                        log.exception("commit listener %r failed", listener)
        resolve(batch, outcomes)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, commit: Commit, *, name: str) -> None:
        """Start taking requests and the writer task (named ``name``), which hands each batch
        to ``commit``. ``commit(batch)`` writes the batch in one transaction and settles the
        futures of its requests (:meth:`settle`); for a failed transaction it fails the
        requests rather than raise. (Held by the task only, so that a closed store is not
        kept alive by a reference cycle.)"""
        self._queue = asyncio.Queue(maxsize=self.queue_max)
        self.accepting, self._stopping, self._closing = True, False, None
        self.task = asyncio.create_task(self._run(commit), name=name)

    async def close(self, release: Callable[[], Awaitable[None]]) -> None:
        """Stop taking requests, commit every pending one, then ``await release()``.

        Idempotent (a no-op when not started); concurrent calls all wait for the same
        shutdown.
        """
        if self.task is None:
            return
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown(release))
        # Shielded: a caller cancelled while closing must not leave the store half closed.
        await asyncio.shield(self._closing)

    async def _shutdown(self, release: Callable[[], Awaitable[None]]) -> None:
        task, queue = self.task, self._queue
        assert task is not None and queue is not None
        self.accepting = False
        self._stopping = True
        self._wake()
        try:
            await task
        except asyncio.CancelledError:
            pass  # the writer was cancelled (loop teardown); pending requests were failed
        finally:
            self._fail_queued(queue)
            self._fail_backlog()
            await release()
            self.task = self._queue = None

    def _wake(self) -> None:
        if self._queue is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(_STOP)

    @staticmethod
    def _fail_queued(queue: asyncio.Queue[Queued | _Stop]) -> None:
        while not queue.empty():
            item = queue.get_nowait()
            if not isinstance(item, _Stop):
                _fail(_requests(item), "the store closed before this append")

    # -- requests ---------------------------------------------------------------------------

    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        expected_seq: int | None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        """Check an ``append`` call, queue it and wait for its outcome (see
        :meth:`hub.log.base.EventStore.append`). Raises :class:`BadRequest` for bad
        arguments, :class:`Unavailable` when not started or closing."""
        if not self.accepting:
            raise Unavailable("the store is not open")
        validate_workspace(workspace)
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        request = self._append_request(workspace, drafts, expected_seq, future, reads=reads)
        queue = self._queue
        assert queue is not None
        if not self._backlog and not queue.full():
            queue.put_nowait(request)  # the common case, without a coroutine of its own
        else:
            await self._enqueue(request)
        return await future

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | AgoraError]:
        """Several ``append`` calls to ``workspace`` (an :class:`AppendItem` each), queued
        at once in order and awaited together: the caller wakes once for them all (a
        connection's pipelined publishes). Each stays a request of its own, checked, decided
        and answered as :meth:`append` would (its ``expected_seq``, its ids, its outcome), so
        one refused never fails the others. Returns one outcome per item, in order. Raises
        :class:`BadRequest` (the workspace) and :class:`Unavailable` as :meth:`append`."""
        if not self.accepting:
            raise Unavailable("the store is not open")
        validate_workspace(workspace)
        return await self._append_group([(workspace, item) for item in items])

    async def append_each(
        self, items: Sequence[tuple[str, AppendItem]]
    ) -> list[AppendResult | AgoraError]:
        """:meth:`append_many` with a workspace per item: the appends another process hands
        this store (:mod:`hub.log.handoff`), queued at once in order and awaited together. A
        bad workspace name is that item's :class:`BadRequest` outcome. Raises
        :class:`Unavailable` as :meth:`append`."""
        if not self.accepting:
            raise Unavailable("the store is not open")
        return await self._append_group(items)

    async def _append_group(
        self, items: Sequence[tuple[str, AppendItem]]
    ) -> list[AppendResult | AgoraError]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        outcomes: list[AppendResult | AgoraError | None] = [None] * len(items)
        # One future for every request of the call (a Group), settled once the last of them
        # has its outcome (the writer settles requests in queue order).
        group = Group(future, 0)
        requests: list[Append] = []
        at: list[int] = []  # the item of each request
        checked: str | None = None  # the workspace name last checked (items mostly share one)
        for index, (workspace, (drafts, expected_seq, reads)) in enumerate(items):
            try:
                if workspace != checked:
                    validate_workspace(workspace)
                    checked = workspace
                request = self._append_request(
                    workspace, drafts, expected_seq, future, group, len(requests), reads
                )
            except BadRequest as e:
                outcomes[index] = e
                continue
            requests.append(request)
            at.append(index)
        group.outcomes = [None] * len(requests)
        group.left = len(requests)
        if not requests:
            return [o for o in outcomes if o is not None]
        try:
            await self._enqueue(tuple(requests))  # one entry: contiguous in the log
            # An error (the writer stopped) fails the requests left without an outcome.
            with contextlib.suppress(Exception):
                await future
        except asyncio.CancelledError:
            future.cancel()  # as a cancelled append: the writer skips (or drops) them
            raise
        error = future.exception()
        for index, outcome in zip(at, group.outcomes, strict=True):
            if isinstance(outcome, AppendResult | AgoraError):
                outcomes[index] = outcome
            elif isinstance(outcome, BaseException):
                outcomes[index] = _as_agora(outcome)
            else:  # none: left without one when the writer stopped
                outcomes[index] = _as_agora(error or Internal("the append has no outcome"))
        return [o for o in outcomes if o is not None]

    def _append_request(
        self,
        workspace: str,
        drafts: Sequence[Event],
        expected_seq: int | None,
        future: asyncio.Future[Any],
        group: Group | None = None,
        index: int = 0,
        reads: frozenset[str] | None = None,
    ) -> Append:
        """The checked request of one ``append`` call. Raises :class:`BadRequest`."""
        return Append(
            workspace,
            tuple(drafts),
            expected_seq,
            self._check_append(drafts, expected_seq),
            future,
            group,
            index,
            reads,
        )

    def _check_append(self, drafts: Sequence[Event], expected_seq: int | None) -> list[str]:
        """Check one ``append`` call's arguments; its client-chosen ids. Raises
        :class:`BadRequest`."""
        if not drafts:
            raise BadRequest("an append needs at least one event", field="events")
        if expected_seq is not None and (type(expected_seq) is not int or expected_seq < 0):
            raise BadRequest("expectedSeq must be an integer >= 0", field="expectedSeq")
        storable = self._storable
        client_ids: list[str] = []
        for draft in drafts:
            if type(draft) not in _KINDS_BY_TYPE:
                raise BadRequest(f"not an event of a known kind: {type(draft).__name__}")
            if draft.id:
                if not storable(draft.id):
                    raise BadRequest("an event id must be UTF-8 text without NUL", field="id")
                client_ids.append(draft.id)
        if len(client_ids) > 1 and len(set(client_ids)) != len(client_ids):
            raise BadRequest("an id is repeated within the batch", field="id")
        return client_ids

    async def import_events(self, workspace: str, events: Sequence[Event]) -> int:
        """Check an ``import_events`` call (the whole log of ``workspace`` from seq 1, every
        event of ``workspace``), queue it and wait for its outcome. Raises
        :class:`BadRequest`, :class:`IntegrityError` naming the first bad seq,
        :class:`Unavailable` when not started or closing."""
        if not self.accepting:
            raise Unavailable("the store is not open")
        validate_workspace(workspace)
        if not events:
            return 0
        storable = self._storable
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
            if not storable(event.id):
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
        await self._enqueue(Import(workspace, batch, future))
        return await future

    async def _enqueue(self, request: Queued) -> None:
        queue = self._queue
        assert queue is not None
        if not self._backlog and not queue.full():
            queue.put_nowait(request)
            return
        # Backpressure: wait in line until the writer has made room and queued us. The writer
        # does not exit while anyone waits here.
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (request, admitted)
        self._backlog.append(entry)
        try:
            await admitted
        except asyncio.CancelledError:
            if not admitted.done() or admitted.cancelled():
                with contextlib.suppress(ValueError):
                    self._backlog.remove(entry)
            raise
        finally:
            if self._stopping and not self._backlog:
                self._wake()

    def _admit(self, queue: asyncio.Queue[Queued | _Stop]) -> None:
        """Move waiting requests into the queue, oldest first, while it has room."""
        while self._backlog and not queue.full():
            request, admitted = self._backlog.popleft()
            if admitted.done():
                continue  # its caller gave up waiting
            queue.put_nowait(request)
            admitted.set_result(None)

    def _fail_backlog(self) -> None:
        while self._backlog:
            item, admitted = self._backlog.popleft()
            _fail(_requests(item), "the store's writer stopped")
            if not admitted.done():
                admitted.set_result(None)

    # -- the writer task --------------------------------------------------------------------

    async def _run(self, commit: Commit) -> None:
        queue = self._queue
        assert queue is not None
        # Requests taken from the queue and not yet written (the rest of an entry that did
        # not fit the last batch), oldest first.
        taken: collections.deque[WriteRequest] = collections.deque()
        batch_max = self.batch_max
        workspaces_max = self.workspaces_max
        try:
            while True:
                if not taken:
                    self._admit(queue)
                    if self._stopping and queue.empty() and not self._backlog:
                        return
                    _take(await queue.get(), taken)
                    self._admit(queue)
                    if not taken:
                        continue
                first = taken.popleft()
                batch = [first]
                size = first.size
                workspaces = {first.workspace}
                # Drain whatever else is queued: that is the group in group commit.
                while size < batch_max:
                    if not taken:
                        if queue.empty():
                            break
                        _take(queue.get_nowait(), taken)
                        self._admit(queue)
                        continue
                    if size + taken[0].size > batch_max:
                        break  # the next batch's
                    if workspaces_max is not None and taken[0].workspace not in workspaces:
                        if len(workspaces) >= workspaces_max:
                            break  # the next batch's too
                        workspaces.add(taken[0].workspace)
                    request = taken.popleft()
                    batch.append(request)
                    size += request.size
                if self.observer is None:
                    await commit(batch)
                    continue
                began = time.perf_counter()
                try:
                    await commit(batch)
                except Exception:
                    self.observer(len(batch), time.perf_counter() - began, True)
                    raise
                self.observer(len(batch), time.perf_counter() - began, False)
        except BaseException:
            self.accepting = False
            _fail(taken, "the store's writer stopped")
            self._fail_queued(queue)
            self._fail_backlog()
            raise


def _requests(item: Queued) -> Sequence[WriteRequest]:
    return item if isinstance(item, tuple) else (item,)


def _take(item: Queued | _Stop, into: collections.deque[WriteRequest]) -> None:
    """Add a queue entry's requests to ``into`` (a stop marker has none)."""
    if isinstance(item, tuple):
        into.extend(item)
    elif not isinstance(item, _Stop):
        into.append(item)


def _fail(requests: Iterable[WriteRequest], why: str) -> None:
    """Fail the callers of ``requests`` still waiting (a group's shared future once)."""
    for request in requests:
        if not request.future.done():
            request.future.set_exception(Unavailable(why))


# -- deciding a batch (no I/O) --------------------------------------------------------------


class TreeGrowth(NamedTuple):
    """How one workspace's tree grows in a batch: from the tree of ``size`` whose chain
    head is ``head``, by a leaf for each of ``canonical``: the canonical bytes
    (hub.core.chain.canonical_bytes) of each new event, in seq order. They are hashed
    together once the batch is decided (:func:`grow_groups`, :func:`grow_trees`: one call
    of hub.core.merkle.extend_canonical per workspace)."""

    size: int
    head: str
    canonical: list[bytes]


def _grow(growth: dict[str, TreeGrowth], workspace: str, current: Tip) -> list[bytes]:
    """The list collecting the canonical bytes of ``workspace``'s new events in this batch."""
    grown = growth.get(workspace)
    if grown is None:
        grown = growth[workspace] = TreeGrowth(current[0], current[1], [])
    return grown.canonical


class Decision(NamedTuple):
    """What :func:`decide_batch` made of a batch."""

    outcomes: list[WriteOutcome]
    """One per request, in order: its result, or the error that rejected it alone."""
    rows: list[tuple[Event, bytes]]
    """The sealed events to insert (with ``encode_event`` of each), in position order."""
    staged: dict[str, Tip]
    """The new tip of every workspace written: the truth once the transaction commits."""
    position: int
    """The next free position once the transaction commits."""
    growth: dict[str, TreeGrowth]
    """Per workspace written: where its tree grows from and the canonical bytes of its new
    events in seq order (:func:`grow_trees`); empty when the batch was decided with
    ``tree=False``."""


def batch_timestamp(last: int) -> int:
    """The timestamp (ms) of a new batch: the wall clock, but never before ``last``, the
    store's previous batch, whatever the clock does. (Clocks of hub nodes sharing a log may
    differ; ``seq`` and ``position`` carry the order.)"""
    return max(time.time_ns() // 1_000_000, last)


def decide_batch(
    batch: Sequence[WriteRequest],
    *,
    tip: Callable[[str], Tip],
    known: Mapping[tuple[str, str], tuple[int, bytes]],
    position: int,
    now: int,
    mint: Callable[[int, int], list[str]],
    tree: bool,
    kinds_since: Callable[[str, int], Iterable[str]],
) -> Decision:
    """Check and seal every request of ``batch`` in memory; nothing is written.

    ``tip(workspace)``: the workspace's stored tip (:data:`EMPTY_TIP` when it has no
    events). ``known``: the batch's client-chosen ids already stored, ``(workspace, id)`` →
    ``(seq, body)``. ``position``: the first free position. ``now``: the batch's timestamp.
    ``mint(now, count)``: ``count`` new event ids. ``tree``: keep each new event's
    canonical bytes for its Merkle leaf (:attr:`Decision.growth`).
    ``kinds_since(workspace, seq)``: the kinds of the stored events past ``seq``, asked only
    for a request with ``reads`` whose ``expected_seq`` the head has passed. A request fails
    alone, with :class:`Conflict` (stale ``expected_seq``, ids partly written before, import
    into a non-empty workspace), :class:`BadRequest` (an event that cannot be encoded) or
    :class:`IntegrityError` (a retried batch whose stored events cannot be decoded); errors
    of ``tip`` propagate and fail the whole batch.
    """
    staged: dict[str, Tip] = {}
    written: dict[tuple[str, str], Event] = {}
    rows: list[tuple[Event, bytes]] = []
    growth: dict[str, TreeGrowth] | None = {} if tree else None
    outcomes: list[WriteOutcome] = []
    minted = iter(
        mint(now, sum(r.size - len(r.client_ids) for r in batch if isinstance(r, Append)))
    )
    for req in batch:
        try:
            if isinstance(req, Append):
                result, position = _append_one(
                    req,
                    tip,
                    staged,
                    written,
                    known,
                    minted,
                    rows,
                    growth,
                    position,
                    now,
                    kinds_since,
                )
                outcomes.append(result)
            else:
                outcomes.append(_import_one(req, tip, staged, rows, growth, position))
                position += req.size
        except AgoraError as e:
            outcomes.append(e)
    return Decision(outcomes, rows, staged, position, {} if growth is None else growth)


def _append_one(
    req: Append,
    tip: Callable[[str], Tip],
    staged: dict[str, Tip],
    written: dict[tuple[str, str], Event],
    known: Mapping[tuple[str, str], tuple[int, bytes]],
    minted: Iterator[str],
    rows: list[tuple[Event, bytes]],
    growth: dict[str, TreeGrowth] | None,
    position: int,
    now: int,
    kinds_since: Callable[[str, int], Iterable[str]],
) -> tuple[AppendResult, int]:
    workspace = req.workspace
    current = staged.get(workspace) or tip(workspace)
    if req.client_ids:
        seen = [i for i in req.client_ids if (workspace, i) in written or (workspace, i) in known]
        if seen:
            if len(seen) == req.size:
                return _originals(req, written, known), position
            raise Conflict(
                f"the batch mixes {len(seen)} id(s) already written with new events",
                head=current[0],
                ids=seen,
            )
    if req.expected_seq is not None:
        _check_expected(req, current, rows, kinds_since)
    seq, prev = current[0], current[1]
    new_rows: list[tuple[Event, bytes]] = []
    canonical: list[bytes] = []  # each event's canonical bytes, for its Merkle leaf
    hashing = growth is not None
    try:
        for draft in req.drafts:
            seq += 1
            event, encoded = seal_canonical(
                draft,
                id=draft.id or next(minted),
                workspace=workspace,
                seq=seq,
                position=position,
                timestamp=now,
                producer=draft.producer,
                prev=prev,
            )
            new_rows.append((event, encode_event(event)))  # fails here, before anything is staged
            if hashing:
                canonical.append(encoded)
            prev = event.hash or GENESIS
            position += 1
    except (TypeError, ValueError, msgspec.EncodeError) as e:
        index = len(new_rows)
        raise BadRequest(f"event {index} cannot be encoded: {e}", index=index) from e
    rows.extend(new_rows)
    if growth is not None:
        _grow(growth, workspace, current).extend(canonical)
    sealed = tuple(event for event, _ in new_rows)
    if req.client_ids:  # minted ids are new by construction: only client ids can repeat
        for event in sealed:
            written[(workspace, event.id)] = event
    staged[workspace] = (seq, prev, position - 1, now)
    return AppendResult(workspace=workspace, events=sealed), position


def _check_expected(
    req: Append,
    current: Tip,
    rows: list[tuple[Event, bytes]],
    kinds_since: Callable[[str, int], Iterable[str]],
) -> None:
    """Raise :class:`Conflict` unless ``req`` may be appended at the head ``current``: its
    ``expected_seq`` is the head, or (``reads`` given) the head has passed it by events of
    kinds the request was not decided on only, stored (``kinds_since``) or staged by this
    batch's earlier requests (all past the stored head: each counts, conservatively)."""
    expected, head = req.expected_seq, current[0]
    if expected is None or expected == head:
        return
    reads = req.reads
    if (
        reads is None
        or expected > head
        or any(e.kind in reads for e, _ in rows if e.workspace == req.workspace)
        or not reads.isdisjoint(kinds_since(req.workspace, expected))
    ):
        raise Conflict(
            f"expected seq {expected} but the head of {req.workspace!r} is {head}",
            head=head,
            expected=expected,
        )


def _originals(
    req: Append,
    written: dict[tuple[str, str], Event],
    known: Mapping[tuple[str, str], tuple[int, bytes]],
) -> AppendResult:
    """The stored events of a retried batch, in the batch's order."""
    workspace = req.workspace
    found = {i: written[(workspace, i)] for i in req.client_ids if (workspace, i) in written}
    stored = sorted(known[(workspace, i)] for i in req.client_ids if i not in found)
    for event in decode_page([body for _, body in stored], [seq for seq, _ in stored], "seq"):
        found[event.id] = event
    return AppendResult(
        workspace=workspace,
        events=tuple(found[i] for i in req.client_ids),
        duplicate=True,
    )


def _import_one(
    req: Import,
    tip: Callable[[str], Tip],
    staged: dict[str, Tip],
    rows: list[tuple[Event, bytes]],
    growth: dict[str, TreeGrowth] | None,
    position: int,
) -> int:
    workspace = req.workspace
    current = staged.get(workspace) or tip(workspace)
    if current[0] != 0:
        raise Conflict(
            f"workspace {workspace!r} is not empty (head {current[0]}); import needs an empty one",
            head=current[0],
        )
    for event in req.events:
        # Positions belong to this store; everything hashed stays verbatim.
        stored = msgspec.structs.replace(event, position=position)
        rows.append((stored, encode_event(stored)))
        position += 1
    if growth is not None:
        _grow(growth, workspace, current).extend(canonical_bytes(event) for event in req.events)
    last = req.events[-1]
    staged[workspace] = (last.seq, last.hash or GENESIS, position - 1, last.timestamp)
    return len(req.events)


# -- the Merkle tree of each workspace (no I/O) ----------------------------------------------
#
# Every batch also writes the stored hashes (hub.core.merkle) of the events it adds, in the
# same transaction: PostgreSQL as runs in their own table (:func:`grow_trees`), SQLite as a
# group per event in the event's own row (:func:`grow_groups`: no row or index entry for the
# tree, measured in docs/audit.md, "Costs"). Growing a workspace's tree needs its *frontier*
# at the batch's start (at most log2 n hashes); the store caches frontiers across batches,
# keyed by the chain head they belong to, and reads or rebuilds a missing one
# (:meth:`TreeTip.matches`).


class TreeTip(NamedTuple):
    """A workspace's tree as of one chain head: its size (= seq), the head's hash, and the
    frontier (hub.core.merkle.frontier_coordinates) of that size.

    ``lineage``: which cached line of growth this tip is on. A store that caches tips gives a
    tip it loads or rebuilds from the database a new lineage (positive), and a tip grown from
    it in memory keeps it: two tips of one workspace with the same lineage are then one tree
    and its extension, by construction, with nothing read back (what
    :meth:`hub.log.base.EventStore.tree_head` lets the checkpointer rely on). 0: not tracked."""

    size: int
    head: str
    frontier: tuple[bytes, ...]
    lineage: int = 0

    def matches(self, size: int, head: str) -> bool:
        """Whether this is the tree of the chain ending at (``size``, ``head``). The chain
        hash covers the whole history, so a cached frontier is never reused for another."""
        return self.size == size and self.head == head


EMPTY_TREE: Final = TreeTip(0, GENESIS, ())

HashRow: TypeAlias = tuple[str, int, bytes]
"""(workspace, idx, hashes): one row of PostgreSQL's ``merkle_hashes`` table, a *run* of consecutive
stored hashes (hub.core.merkle's dense sequence) starting at stored index ``idx``,
concatenated (32 bytes each). A batch writes one run per workspace (split every
:data:`RUN_MAX` hashes) instead of a row per hash: the tree then costs the commit a few
rows, not two per event. Readers slice the run (``substr``)."""

RUN_MAX: Final = 1024  # hashes in one run: 32 KiB


def runs(workspace: str, first: int, hashes: list[bytes]) -> list[HashRow]:
    """``hashes`` (stored from index ``first`` on) as rows of at most :data:`RUN_MAX`."""
    return [
        (workspace, first + i, b"".join(hashes[i : i + RUN_MAX]))
        for i in range(0, len(hashes), RUN_MAX)
    ]


def grow_trees(
    growth: Mapping[str, TreeGrowth], trees: Mapping[str, TreeTip], staged: Mapping[str, Tip]
) -> tuple[list[HashRow], dict[str, TreeTip]]:
    """The stored hashes a batch adds (one run per workspace), and each written workspace's
    new tree tip. ``growth``: :attr:`Decision.growth`; ``trees``: each written workspace's
    tree as of the batch's start (its :class:`TreeGrowth` size and head); ``staged``: the
    new chain tips. Each workspace's leaves are hashed and added in one call
    (hub.core.merkle.extend_canonical): this runs inside every commit."""
    hash_rows: list[HashRow] = []
    tips: dict[str, TreeTip] = {}
    for workspace, grown in growth.items():
        tree = trees[workspace]
        hashes, frontier = extend_canonical(tree.frontier, tree.size, grown.canonical, False)
        seq, head = staged[workspace][0], staged[workspace][1]
        assert tree.size + len(grown.canonical) == seq, "bad math: the tree and the chain differ"
        hash_rows.extend(runs(workspace, stored_hash_count(tree.size), hashes))
        tips[workspace] = TreeTip(seq, head, frontier, tree.lineage)
    return hash_rows, tips


def grow_groups(
    growth: Mapping[str, TreeGrowth], trees: Mapping[str, TreeTip], staged: Mapping[str, Tip]
) -> tuple[dict[str, list[bytes]], dict[str, TreeTip]]:
    """:func:`grow_trees` for a store that keeps each event's stored hashes in the event's
    own row: per written workspace, one group per new event in seq order (the hashes that
    event's leaf stores, concatenated: hub.core.merkle.CompactRange.extend_groups), and each
    workspace's new tree tip."""
    groups: dict[str, list[bytes]] = {}
    tips: dict[str, TreeTip] = {}
    for workspace, grown in growth.items():
        tree = trees[workspace]
        out, frontier = extend_canonical(tree.frontier, tree.size, grown.canonical, True)
        seq, head = staged[workspace][0], staged[workspace][1]
        assert tree.size + len(grown.canonical) == seq, "bad math: the tree and the chain differ"
        groups[workspace] = out
        tips[workspace] = TreeTip(seq, head, frontier, tree.lineage)
    return groups, tips


class TreeBuilder:
    """Rebuilds a workspace's stored hashes from its events (derived data: for a log written
    before the tree existed, or whose hashes were lost). Feed every event from seq 1 in
    order, a page at a time; each :meth:`add` returns the hash rows to store."""

    __slots__ = ("tip", "workspace")

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.tip = EMPTY_TREE

    def add(self, events: Iterable[Event]) -> list[HashRow]:
        """Raises :class:`IntegrityError` for a gap or an event of another workspace."""
        first = stored_hash_count(self.tip.size)
        hashes: list[bytes] = []
        self._extend(events, hashes, grouped=False)
        return runs(self.workspace, first, hashes)

    def add_groups(self, events: Iterable[Event]) -> list[tuple[bytes, int]]:
        """:meth:`add` for a store keeping each event's hashes in its row: (group, seq) of
        each event (:func:`grow_groups`)."""
        first = self.tip.size + 1
        groups: list[bytes] = []
        self._extend(events, groups, grouped=True)
        return [(group, first + i) for i, group in enumerate(groups)]

    def _extend(self, events: Iterable[Event], out: list[bytes], *, grouped: bool) -> None:
        tip = self.tip
        head = tip.head
        canonical: list[bytes] = []
        for event in events:
            expected = tip.size + len(canonical) + 1
            if event.seq != expected or event.workspace != self.workspace:
                raise IntegrityError(
                    f"cannot build the tree of {self.workspace!r}: expected seq "
                    f"{expected}, got seq {event.seq}",
                    seq=expected,
                )
            canonical.append(canonical_bytes(event))
            head = event.hash or GENESIS
        hashes, frontier = extend_canonical(tip.frontier, tip.size, canonical, grouped)
        out.extend(hashes)
        self.tip = TreeTip(tip.size + len(canonical), head, frontier)
