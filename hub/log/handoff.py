"""Writes handed to the one process that writes a SQLite file (``agora serve --workers N``).

Why. Several processes appending to one SQLite file take turns at its write lock, and one
that finds the lock taken retries under SQLite's busy handler, which sleeps between tries
(1, 2, 5 … 100 ms): measured (``bench/shared_file_bench.py``), two processes appending to one
file reach 0.56x of two processes on two files, with appends waiting up to 0.8 s, and two
workers of one hub ingested less than one. So with ``--workers`` one process writes the file,
and the others hand it their writes:

* The supervisor opens the file's one writing store (a :class:`SqliteEventStore`: its group
  commit, its writer thread, its cached heads) and serves it on a unix socket,
  ``<data>/workers/writer.sock`` (mode 0600 in a 0700 directory): :class:`HandoffServer`.
* Each worker's store is a :class:`HandoffStore`: a :class:`SqliteEventStore` that reads the
  file itself (its reader and walker connections; WAL lets readers run beside the writer)
  and hands every write to the server: each batch of its group commit (one call), and each
  checkpoint, cosignature, snapshot and hash rebuild. What it hands are the same requests
  its own writer thread would have written, decided the same way, so everything above the
  store is unchanged.
* The server queues each batch's appends as one entry of its store's group commit
  (:meth:`hub.log.writer.GroupCommit.append_each`), in the order the calls arrive: the
  batches of every worker share its transactions, and one fsync covers them all.

Chosen over one SQLite file per shard of workspaces, which would have given each worker a file
of its own: with one file every command (``agora export``, ``verify``, ``append``, the viewer),
every cross-workspace read (heads, the system workspace, recovery) and ``position`` (one
append order across workspaces) stay as they are, and ``--workers`` can change between starts.
The price is one process's writer for the whole hub (docs/architecture.md, "Workers").

The wire, between processes of one hub of one version: frames of a 4-byte big-endian length
and a JSON body (msgspec, tagged structs), at most :data:`FRAME_MAX` bytes; a batch whose
calls would pass :data:`FRAME_SOFT` is handed in several calls, in order (a single append
larger than a frame is refused ``tooLarge``, nothing written). Each call carries a ``ref``
its reply repeats: replies come in any order. Errors cross as their class's name, message
and details (several classes share one wire code, :mod:`hub.core.errors`, and the hub
treats them apart: an :class:`IntegrityError` quarantines a workspace). A frame that does
not decode ends the connection (a bug, logged); the worker's store reconnects on its next
call. A call whose connection is lost before its reply fails ``unavailable`` (it may have
been committed: a retry with the same ids answers ``duplicate``, as after any failed commit).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias, cast

import msgspec

from hub.core.chain import GENESIS, sealed_as
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import (
    AgoraError,
    BadRequest,
    Busy,
    Conflict,
    Exists,
    Forbidden,
    IntegrityError,
    Internal,
    NotFound,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from hub.core.events import AnyEvent, Event
from hub.core.records import AppendResult, Snapshot
from hub.log.base import AppendItem
from hub.log.sqlite import SqliteEventStore
from hub.log.writer import Append, Import, WriteOutcome, WriteRequest

__all__ = ["FRAME_MAX", "FRAME_SOFT", "HandoffServer", "HandoffStore"]

log = logging.getLogger("agora.log")

FRAME_MAX: Final = 1024 * 1024 * 1024
"""The largest frame either side reads or sends (its length is checked before its body is
read)."""

FRAME_SOFT: Final = 16 * 1024 * 1024
"""A batch is handed in calls of about this many bytes (each holds at least one request)."""

CALLS_IN_FLIGHT: Final = 256
"""Calls of one connection the server runs at once; it reads no further frame meanwhile."""

_LENGTH: Final = struct.Struct(">I")


# -- the calls -----------------------------------------------------------------------------


class AppendOp(msgspec.Struct, tag="append", array_like=True, frozen=True):
    """One queued ``append`` (:class:`hub.log.writer.Append`)."""

    workspace: str
    drafts: list[AnyEvent]
    expected_seq: int | None = None
    reads: list[str] | None = None


class ImportOp(msgspec.Struct, tag="import", array_like=True, frozen=True):
    """One queued ``import_events`` (:class:`hub.log.writer.Import`)."""

    workspace: str
    events: list[AnyEvent]


class CommitCall(msgspec.Struct, tag="commit", array_like=True, frozen=True):
    ref: int
    ops: list[AppendOp | ImportOp]


class CheckpointCall(msgspec.Struct, tag="checkpoint", array_like=True, frozen=True):
    ref: int
    record: CheckpointRecord


class CosignCall(msgspec.Struct, tag="cosign", array_like=True, frozen=True):
    ref: int
    workspace: str
    size: int
    cosignatures: str


class SnapshotCall(msgspec.Struct, tag="snapshot", array_like=True, frozen=True):
    ref: int
    snapshot: Snapshot


class DropSnapshotsCall(msgspec.Struct, tag="dropSnapshots", array_like=True, frozen=True):
    ref: int
    workspace: str | None


class RebuildCall(msgspec.Struct, tag="rebuild", array_like=True, frozen=True):
    ref: int
    workspace: str


Call: TypeAlias = (
    CommitCall | CheckpointCall | CosignCall | SnapshotCall | DropSnapshotsCall | RebuildCall
)


# -- the replies ---------------------------------------------------------------------------


class Sealed(msgspec.Struct, tag="sealed", array_like=True, frozen=True):
    """A new :class:`AppendResult`, as what sealing added to the request's drafts: the first
    event's ``seq``, ``position`` and ``prev`` (consecutive after it, each ``prev`` the hash
    before), the one ``timestamp``, each event's hash, and the ids minted for the drafts
    that had none, in order (:func:`hub.core.chain.sealed_as` rebuilds the events)."""

    seq: int
    position: int
    timestamp: int
    prev: str
    hashes: list[str]
    minted: list[str]


class Appended(msgspec.Struct, tag="appended", array_like=True, frozen=True):
    """An :class:`AppendResult` whose events are not the drafts sealed (a ``duplicate``
    answer: what was written before), whole. Its workspace is the request's."""

    events: list[AnyEvent]
    duplicate: bool = False


class Imported(msgspec.Struct, tag="imported", array_like=True, frozen=True):
    count: int


class CarriedError(msgspec.Struct, tag="error", array_like=True, frozen=True):
    """An :class:`AgoraError` as it crosses: its class's name, message and details."""

    name: str
    message: str
    details: dict[str, Any] = {}


class Outcomes(msgspec.Struct, tag="outcomes", array_like=True, frozen=True):
    """A :class:`CommitCall`'s outcome of each op, in order."""

    ref: int
    outcomes: list[Sealed | Appended | Imported | CarriedError]


class Value(msgspec.Struct, tag="value", array_like=True, frozen=True):
    """Another call's result (a count, whether a checkpoint was new, or None)."""

    ref: int
    value: bool | int | None = None


class Failed(msgspec.Struct, tag="failed", array_like=True, frozen=True):
    ref: int
    error: CarriedError


Answer: TypeAlias = Outcomes | Value | Failed

_ERRORS: Final[dict[str, type[AgoraError]]] = {
    cls.__name__: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        TooLarge,
        RateLimited,
        Busy,
        Exists,
        Unavailable,
        Internal,
        IntegrityError,
    )
}
"""The errors a store's writes raise, by the name they cross as (any other: Internal)."""

_encoder: Final = msgspec.json.Encoder()
_calls: Final = msgspec.json.Decoder(Call)
_replies: Final = msgspec.json.Decoder(Answer)


def carried(error: AgoraError) -> CarriedError:
    """``error`` as it crosses (details that do not encode are left out)."""
    name = type(error).__name__ if type(error).__name__ in _ERRORS else Internal.__name__
    details = error.details
    try:
        _encoder.encode(details)
    except (TypeError, ValueError, OverflowError):
        details = {}
    return CarriedError(name, error.message, details)


def raised(error: CarriedError) -> AgoraError:
    """The error a :class:`CarriedError` stands for."""
    cls = _ERRORS.get(error.name, Internal)
    try:
        return cls(error.message, **error.details)
    except TypeError:  # details its constructor does not take
        return cls(error.message)


class FrameError(Exception):
    """A frame over :data:`FRAME_MAX`, or a connection that ended inside one."""


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's body, or None at a clean end of the stream. Raises
    :class:`FrameError`."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError("the connection ended inside a frame's length") from e
        return None
    (size,) = _LENGTH.unpack(head)
    if size > FRAME_MAX:
        raise FrameError(f"a frame of {size} bytes; the limit is {FRAME_MAX}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError("the connection ended inside a frame") from e


def frame(body: bytes) -> bytes:
    """``body`` framed. Raises :class:`TooLarge` over :data:`FRAME_MAX`."""
    if len(body) > FRAME_MAX:
        raise TooLarge(
            f"a write of {len(body)} bytes to hand to the hub's writer; the limit is {FRAME_MAX}",
            size=len(body),
            limit=FRAME_MAX,
        )
    return _LENGTH.pack(len(body)) + body


# -- the server (in the supervisor) ---------------------------------------------------------


class HandoffServer:
    """Serves ``store``'s writes to the workers on the unix socket ``path``
    (``async with HandoffServer(store, path):``; ``store`` is opened and closed by its
    owner). Each connection's calls run at once, up to :data:`CALLS_IN_FLIGHT`, and are
    queued in the store in the order they arrived."""

    def __init__(self, store: SqliteEventStore, path: Path) -> None:
        self.store = store
        self.path = path
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HandoffServer:
        await asyncio.to_thread(self.path.unlink, missing_ok=True)  # a killed predecessor's
        self._server = await asyncio.start_unix_server(self._accept, str(self.path))
        await asyncio.to_thread(self.path.chmod, 0o600)
        return self

    async def __aexit__(self, *exc: object) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self.path.unlink, missing_ok=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # the server is closing
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slots = asyncio.Semaphore(CALLS_IN_FLIGHT)
        async with asyncio.TaskGroup() as tg:  # a bad frame: the calls before it still end
            while True:
                try:
                    body = await read_frame(reader)
                    if body is None:
                        return
                    call = _calls.decode(body)
                except (FrameError, msgspec.DecodeError, msgspec.ValidationError) as e:
                    log.error("a worker handed the writer a bad frame (%s); closing it", e)
                    return
                except (ConnectionError, OSError):
                    return  # the worker went away
                await slots.acquire()
                # Tasks start in the order they are made: each queues its appends in its
                # first step, so calls reach the store in the order they arrived.
                tg.create_task(self._answer(call, writer, slots))

    async def _answer(
        self, call: Call, writer: asyncio.StreamWriter, slots: asyncio.Semaphore
    ) -> None:
        try:
            try:
                reply: Answer = await self._run(call)
            except AgoraError as e:
                reply = Failed(call.ref, carried(e))
            except Exception as e:  # a bug: that call fails, the connection stays
                log.exception("handing a write to the store failed")
                reply = Failed(call.ref, carried(Internal(f"the hub's writer failed: {e!r}")))
            try:
                data = frame(_encoder.encode(reply))
            except TooLarge as e:
                data = frame(_encoder.encode(Failed(call.ref, carried(e))))
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(data)
                await writer.drain()
        finally:
            slots.release()

    async def _run(self, call: Call) -> Answer:
        store = self.store
        if type(call) is CommitCall:
            return Outcomes(call.ref, await self._commit(call.ops))
        if type(call) is CheckpointCall:
            return Value(call.ref, await store.save_checkpoint(call.record))
        if type(call) is CosignCall:
            await store.set_cosignatures(call.workspace, call.size, call.cosignatures)
            return Value(call.ref)
        if type(call) is SnapshotCall:
            await store.save_snapshot(call.snapshot)
            return Value(call.ref)
        if type(call) is DropSnapshotsCall:
            return Value(call.ref, await store.delete_snapshots(call.workspace))
        assert type(call) is RebuildCall
        return Value(call.ref, await store.rebuild_hashes(call.workspace))

    async def _commit(
        self, ops: Sequence[AppendOp | ImportOp]
    ) -> list[Sealed | Appended | Imported | CarriedError]:
        """Queue a batch's ops in order: each run of appends as one entry (one wake-up), an
        import alone (it checks its chain first, off the loop)."""
        out: list[Sealed | Appended | Imported | CarriedError] = []
        at = 0
        while at < len(ops):
            op = ops[at]
            if type(op) is ImportOp:
                try:
                    out.append(Imported(await self.store.import_events(op.workspace, op.events)))
                except AgoraError as e:
                    out.append(carried(e))
                at += 1
                continue
            run: list[tuple[str, AppendItem]] = []
            while at < len(ops) and type(op := ops[at]) is AppendOp:
                reads = None if op.reads is None else frozenset(op.reads)
                run.append((op.workspace, AppendItem(op.drafts, op.expected_seq, reads)))
                at += 1
            for (_, item), outcome in zip(run, await self.store.append_each(run), strict=True):
                if not isinstance(outcome, AppendResult):
                    out.append(carried(outcome))
                elif outcome.duplicate:
                    out.append(Appended(_any(outcome.events), duplicate=True))
                else:
                    out.append(_sealed(item.drafts, outcome.events))
        return out


# -- the workers' side -----------------------------------------------------------------------


class _Link:
    """One connection to a :class:`HandoffServer`: calls out, replies matched by ``ref``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: dict[int, asyncio.Future[Answer]] = {}
        self._refs = itertools.count(1)
        self.closed = False
        self._task = asyncio.create_task(self._read(reader), name="agora-handoff-replies")

    @classmethod
    async def connect(cls, path: Path) -> _Link:
        """Raises :class:`Unavailable` when nothing serves ``path``."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
        except OSError as e:
            raise Unavailable(f"the hub's writer is not reachable at {path}: {e}") from e
        return cls(reader, writer)

    async def call(self, make: Callable[[int], msgspec.Struct]) -> Answer:
        """Send ``make(ref)`` and wait for its reply. Raises :class:`Unavailable` when the
        connection is lost first, :class:`TooLarge` for a call over :data:`FRAME_MAX`."""
        if self.closed:
            raise Unavailable("the connection to the hub's writer was lost")
        ref = next(self._refs)
        data = frame(_encoder.encode(make(ref)))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        try:
            self._writer.write(data)
            await self._writer.drain()
            return await future
        except (ConnectionError, OSError) as e:
            self._lost(e)
            raise Unavailable(f"the connection to the hub's writer was lost: {e}") from e
        finally:
            self._pending.pop(ref, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why: BaseException | str = "the hub's writer closed the connection"
        try:
            while (body := await read_frame(reader)) is not None:
                reply = _replies.decode(body)
                future = self._pending.pop(reply.ref, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (FrameError, msgspec.DecodeError, msgspec.ValidationError) as e:
            log.error("the hub's writer sent a bad frame (%s); reconnecting", e)
            why = e
        except (ConnectionError, OSError) as e:
            why = e
        finally:
            self._lost(why)

    def _lost(self, why: BaseException | str) -> None:
        self.closed = True
        self._writer.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(
                    Unavailable(f"the connection to the hub's writer was lost: {why}")
                )

    async def aclose(self) -> None:
        self._lost("the store closed")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def _any(events: Iterable[Event]) -> list[AnyEvent]:
    """``events`` as the tagged union they are (every event is one of its kinds)."""
    return cast("list[AnyEvent]", list(events))


def _op(request: WriteRequest) -> AppendOp | ImportOp:
    if type(request) is Append:
        reads = None if request.reads is None else sorted(request.reads)
        return AppendOp(request.workspace, _any(request.drafts), request.expected_seq, reads)
    assert type(request) is Import
    return ImportOp(request.workspace, _any(request.events))


def _calls_of(batch: list[WriteRequest]) -> list[list[msgspec.Raw]]:
    """The batch's ops encoded, in calls of about :data:`FRAME_SOFT` bytes each."""
    calls: list[list[msgspec.Raw]] = [[]]
    size = 0
    for request in batch:
        op = msgspec.Raw(_encoder.encode(_op(request)))
        if calls[-1] and size + len(op) > FRAME_SOFT:
            calls.append([])
            size = 0
        calls[-1].append(op)
        size += len(op)
    return calls


class _RawCommit(msgspec.Struct, tag="commit", array_like=True, frozen=True):
    """A :class:`CommitCall` as sent: its ops encoded already (:func:`_calls_of`)."""

    ref: int
    ops: list[msgspec.Raw]


class HandoffStore(SqliteEventStore):
    """A :class:`SqliteEventStore` of a worker of ``agora serve --workers``: reads the file
    itself, hands every write to the :class:`HandoffServer` at ``socket`` (module doc). The
    file must exist with this code's schema (the supervisor migrated it). Everything else is
    a :class:`SqliteEventStore`'s; :meth:`tree_head` answers None (the trees are cached by
    the writer, in the supervisor)."""

    def __init__(self, path: Path, *, socket: Path, blobs_dir: Path | None = None) -> None:
        super().__init__(path, blobs_dir=blobs_dir)
        self.socket = socket
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._own: collections.deque[tuple[int, int]] | None = None

    def __repr__(self) -> str:
        return f"HandoffStore({str(self.path)!r}, socket={str(self.socket)!r})"

    async def _open(self) -> None:
        # mode=rw: never create the file (the writer makes and migrates it).
        target = f"{(await asyncio.to_thread(self.path.absolute)).as_uri()}?mode=rw"
        await self._open_reading(target, uri=True, how="(the hub's writer migrates it)")
        try:
            self._link = await _Link.connect(self.socket)
        except BaseException:
            await super()._release()
            raise
        self._commits.start(self._commit, name=f"agora-handoff:{self.path}")

    async def _release(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await link.aclose()
        await super()._release()

    async def _connected(self) -> _Link:
        """The live connection, or a new one after a lost one. Raises :class:`Unavailable`."""
        if not self._commits.accepting:
            raise Unavailable("the store is not open")
        link = self._link
        if link is not None and not link.closed:
            return link
        async with self._connecting:
            link = self._link
            if link is None or link.closed:
                if link is not None:
                    await link.aclose()
                self._link = link = await _Link.connect(self.socket)
            return link

    async def _call(self, make: Callable[[int], msgspec.Struct]) -> bool | int | None:
        reply = await (await self._connected()).call(make)
        if type(reply) is Failed:
            raise raised(reply.error)
        if type(reply) is not Value:
            raise Internal(f"the hub's writer answered {type(reply).__name__} to a call")
        return reply.value

    # -- the group commit's batches ------------------------------------------------------------

    async def _commit(self, batch: list[WriteRequest]) -> None:
        try:
            outcomes = await self._hand(batch)
        except AgoraError as e:  # each caller gets an error of its own
            outcomes = [raised(carried(e)) for _ in batch]
        own = self._own
        if own is not None:
            for outcome in outcomes:
                if type(outcome) is AppendResult and not outcome.duplicate:
                    first, last = outcome.events[0].position, outcome.events[-1].position
                    if own and own[-1][1] + 1 == first:
                        own[-1] = (own[-1][0], last)
                    else:
                        own.append((first, last))
        self._commits.settle(batch, outcomes)

    async def _hand(self, batch: list[WriteRequest]) -> list[WriteOutcome]:
        """The outcome of each request of ``batch``, handed in one call or a few (in order,
        awaited together). Raises :class:`Unavailable`, :class:`TooLarge`."""
        link = await self._connected()
        calls = [functools.partial(_RawCommit, ops=ops) for ops in _calls_of(batch)]
        replies = await asyncio.gather(*(link.call(make) for make in calls))
        outcomes: list[WriteOutcome] = []
        for reply in replies:
            if type(reply) is Failed:
                raise raised(reply.error)
            if type(reply) is not Outcomes:
                raise Internal(f"the hub's writer answered {type(reply).__name__} to a batch")
            for outcome in reply.outcomes:
                outcomes.append(_outcome(outcome, batch[len(outcomes)]))
        if len(outcomes) != len(batch):
            raise Internal(f"the hub's writer answered {len(outcomes)} of {len(batch)} writes")
        return outcomes

    # -- the other writes --------------------------------------------------------------------

    async def save_checkpoint(self, record: CheckpointRecord) -> bool:
        """See :meth:`EventStore.save_checkpoint`."""
        return bool(await self._call(lambda ref: CheckpointCall(ref, record)))

    async def set_cosignatures(self, workspace: str, size: int, cosignatures: str) -> None:
        """See :meth:`EventStore.set_cosignatures`."""
        await self._call(lambda ref: CosignCall(ref, workspace, size, cosignatures))

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """See :meth:`SqliteEventStore.save_snapshot`."""
        await self._call(lambda ref: SnapshotCall(ref, snapshot))

    async def delete_snapshots(self, workspace: str | None = None) -> int:
        """See :meth:`SqliteEventStore.delete_snapshots`."""
        return int(await self._call(lambda ref: DropSnapshotsCall(ref, workspace)) or 0)

    async def rebuild_hashes(self, workspace: str) -> int:
        """See :meth:`EventStore.rebuild_hashes`."""
        return int(await self._call(lambda ref: RebuildCall(ref, workspace)) or 0)

    # -- following: this store's commits are the ones its calls were answered for ------------

    def _track_own(self, own: collections.deque[tuple[int, int]]) -> None:
        self._own = own

    def _untrack_own(self, own: collections.deque[tuple[int, int]]) -> None:
        if self._own is own:
            self._own = None


def _sealed(drafts: Sequence[Event], events: Sequence[Event]) -> Sealed:
    first = events[0]
    return Sealed(
        first.seq,
        first.position,
        first.timestamp,
        first.prev or GENESIS,
        [event.hash or "" for event in events],
        [event.id for draft, event in zip(drafts, events, strict=True) if not draft.id],
    )


def _unsealed(outcome: Sealed, request: WriteRequest) -> AppendResult:
    """The events the writer stored of ``request``'s drafts (:class:`Sealed`)."""
    assert type(request) is Append
    unnamed = sum(1 for draft in request.drafts if not draft.id)
    if len(outcome.hashes) != request.size or len(outcome.minted) != unnamed:
        raise Internal(
            f"the hub's writer sealed {len(outcome.hashes)} of {request.size} events, "
            f"minting {len(outcome.minted)} of {unnamed} ids"
        )
    minted = iter(outcome.minted)
    workspace, seq, position = request.workspace, outcome.seq, outcome.position
    prev, timestamp = outcome.prev, outcome.timestamp
    events: list[Event] = []
    for draft, digest in zip(request.drafts, outcome.hashes, strict=True):
        id_ = draft.id or next(minted)
        events.append(
            sealed_as(
                draft,
                id=id_,
                workspace=workspace,
                seq=seq,
                position=position,
                timestamp=timestamp,
                prev=prev,
                hash=digest,
            )
        )
        seq, position, prev = seq + 1, position + 1, digest
    return AppendResult(workspace, tuple(events))


def _outcome(
    outcome: Sealed | Appended | Imported | CarriedError, request: WriteRequest
) -> WriteOutcome:
    if type(outcome) is Sealed:
        return _unsealed(outcome, request)
    if type(outcome) is Appended:
        return AppendResult(request.workspace, tuple(outcome.events), outcome.duplicate)
    if type(outcome) is Imported:
        return outcome.count
    assert type(outcome) is CarriedError
    return raised(outcome)
