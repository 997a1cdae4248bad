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
  and hands every write to the server: each batch of its group commit (one call, or a few),
  and each checkpoint, cosignature, snapshot and hash rebuild. What it hands are the same
  requests its own writer thread would have written, decided the same way, so everything
  above the store is unchanged.
* The server queues each call's appends as one entry of its store's group commit
  (:meth:`hub.log.writer.GroupCommit.append_each`), in the order the calls arrive (a call
  that imports a log is run alone: nothing behind it is read until it is written): the
  batches of every worker share its transactions, and one fsync covers them all.

Chosen over one SQLite file per shard of workspaces, which would have given each worker a file
of its own: with one file every command (``agora export``, ``verify``, ``append``, the viewer),
every cross-workspace read (heads, the system workspace, recovery) and ``position`` (one
append order across workspaces) stay as they are, and ``--workers`` can change between starts.
The price is one process's writer for the whole hub (docs/architecture.md, "Workers").

The wire, between processes of one hub of one version: frames of a 4-byte big-endian length
and a JSON body (msgspec, tagged structs), at most :data:`FRAME_MAX` bytes. A batch is handed
in calls of about :data:`FRAME_SOFT` bytes, in order, each answered for its own requests; a
single request larger than a frame is refused ``tooLarge`` there, and only it. Each call
carries a ``ref`` its reply repeats: replies come in any order. A new append is answered with
what sealing added (:class:`Sealed`), which the worker turns back into the stored events
(:func:`hub.core.chain.sealed_as`). Errors cross as their class's name, message and details
(several classes share one wire code, :mod:`hub.core.errors`, and the hub treats them apart:
an :class:`IntegrityError` quarantines a workspace). A frame that does not decode ends the
connection (a bug, logged); the worker's store reconnects on its next call. A call whose
connection is lost before its reply, or not answered within :data:`CALL_TIMEOUT_S`, fails
``unavailable``: it may have been committed, and a retry with the same ids answers
``duplicate``, as after any failed commit.

Bounded: a frame (:data:`FRAME_MAX`, and its body is read within :data:`BODY_TIMEOUT_S` once
its length is in), the bytes of one connection's calls being run (:data:`BYTES_IN_FLIGHT`;
one larger call runs alone) and their number (:data:`CALLS_IN_FLIGHT`), the connections
(:data:`CONNECTIONS_MAX`). A frame over 1 MiB is decoded off the event loop. Only the hub's
own processes reach the socket (its directory is 0700), so these bound the damage of a bug,
not of an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias, cast

import msgspec

from hub.core.chain import GENESIS, sealed_as
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import (
    ERROR_TABLE,
    AgoraError,
    IntegrityError,
    Internal,
    TooLarge,
    Unavailable,
)
from hub.core.events import AnyEvent, Event
from hub.core.records import AppendResult, Snapshot
from hub.log.base import AppendItem
from hub.log.sqlite import OwnRanges, SqliteEventStore
from hub.log.writer import Append, Import, WriteOutcome, WriteRequest

__all__ = ["FRAME_MAX", "FRAME_SOFT", "HandoffServer", "HandoffStore"]

log = logging.getLogger("agora.log")

FRAME_MAX: Final = 1024 * 1024 * 1024
"""The largest frame either side reads or sends (its length is checked before its body is
read): above the largest publish a session takes (``max_batch_events`` events of
``max_event_bytes``)."""

FRAME_SOFT: Final = 16 * 1024 * 1024
"""A batch is handed in calls of about this many bytes (each holds at least one request)."""

CALLS_IN_FLIGHT: Final = 256
BYTES_IN_FLIGHT: Final = 64 * 1024 * 1024
"""Calls of one connection the server runs at once, and the bytes of their frames: it reads
no further frame meanwhile (a larger frame waits until nothing else runs)."""

CONNECTIONS_MAX: Final = 64
"""Connections the server holds at once (a worker keeps one); one more is closed at once."""

BODY_TIMEOUT_S: Final = 60.0
"""Once a frame's length is read, its body must follow within this (else the connection is
closed); between frames a connection may idle as long as it likes."""

CALL_TIMEOUT_S: Final = 60.0
"""A call not answered within this fails ``unavailable`` on the worker (the writer stalls:
a commit that long is an outage, as SQLite's busy timeout was for a worker writing itself)."""

_DECODE_ON_LOOP_MAX: Final = 1024 * 1024

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
    cls.__name__: cls for cls in (*(row.error for row in ERROR_TABLE), IntegrityError)
}
"""The errors that cross, by their class's name: the table's, and :class:`IntegrityError`,
which shares ``internal``'s code (any other crosses as its nearest of these)."""

_encoder: Final = msgspec.json.Encoder()
_calls: Final = msgspec.json.Decoder(Call)
_replies: Final = msgspec.json.Decoder(Answer)


def carried(error: AgoraError) -> CarriedError:
    """``error`` as it crosses: as the nearest class of :data:`_ERRORS` it is an instance of
    (details that do not encode are left out)."""
    name = next((c.__name__ for c in type(error).__mro__ if c.__name__ in _ERRORS), "Internal")
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
        async with asyncio.timeout(BODY_TIMEOUT_S):
            return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError("the connection ended inside a frame") from e
    except TimeoutError as e:
        raise FrameError(f"a frame's body did not come within {BODY_TIMEOUT_S:g} s") from e


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
    owner). Each connection's calls run at once, within the module's bounds, and are queued
    in the store in the order they arrived."""

    def __init__(self, store: SqliteEventStore, path: Path) -> None:
        self.store = store
        self.path = path
        self._server: asyncio.Server | None = None
        # Each connection being served → the pid of the process at its other end (None when
        # the platform does not tell).
        self._connections: dict[asyncio.Task[None], int | None] = {}

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

    async def drained(self, pid: int) -> None:
        """Once no connection of process ``pid`` is served any more: each has ended and
        every call it had sent is written (a dead worker's last writes, which the socket may
        still hold when its process is reaped)."""
        tasks = [task for task, peer in self._connections.items() if peer == pid]
        if tasks:
            await asyncio.wait(tasks)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            if len(self._connections) >= CONNECTIONS_MAX:
                log.error(
                    "the hub's writer holds %d connections already; closing one more",
                    CONNECTIONS_MAX,
                )
                return
            self._connections[task] = _peer_pid(writer)
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # the server is closing
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        budget = _Budget()
        async with asyncio.TaskGroup() as tg:  # a bad frame: the calls before it still end
            while True:
                try:
                    body = await read_frame(reader)
                    if body is None:
                        return
                    if len(body) <= _DECODE_ON_LOOP_MAX:
                        call = _calls.decode(body)
                    else:
                        call = await asyncio.to_thread(_calls.decode, body)
                except (FrameError, msgspec.DecodeError, msgspec.ValidationError) as e:
                    log.error("a worker handed the writer a bad frame (%s); closing it", e)
                    return
                except (ConnectionError, OSError):
                    return  # the worker went away
                await budget.take(len(body))
                answer = self._answer(call, writer, budget, len(body))
                if type(call) is CommitCall and any(type(op) is ImportOp for op in call.ops):
                    # An import checks its chain off the loop before it is queued: run alone,
                    # so that no call behind it is queued first.
                    await answer
                    continue
                # Tasks start in the order they are made: each queues its appends in its
                # first step, so calls reach the store in the order they arrived.
                tg.create_task(answer)

    async def _answer(
        self, call: Call, writer: asyncio.StreamWriter, budget: _Budget, size: int
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
            budget.give(size)

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
        """Queue a call's ops in order: each run of appends as one entry (one wake-up), an
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


class _Budget:
    """The bytes and the number of one connection's calls being run (module doc); taken by
    the connection's read loop alone, given back by each call as it ends."""

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self._room = asyncio.Event()
        self._room.set()

    def _fits(self, size: int) -> bool:
        if self.calls == 0:
            return True  # one call larger than the budget runs alone
        return self.calls < CALLS_IN_FLIGHT and self.bytes + size <= BYTES_IN_FLIGHT

    async def take(self, size: int) -> None:
        while not self._fits(size):
            self._room.clear()
            await self._room.wait()
        self.bytes += size
        self.calls += 1

    def give(self, size: int) -> None:
        self.bytes -= size
        self.calls -= 1
        self._room.set()


def _peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The pid of the process at the other end of a unix socket (``SO_PEERCRED``, Linux)."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    except OSError:
        return None
    pid: int = struct.unpack("3i", creds)[0]
    return pid


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

    def send(self, make: Callable[[int], msgspec.Struct]) -> asyncio.Future[Answer]:
        """Write ``make(ref)`` now (calls reach the server in the order they are sent) and
        return the future of its reply. Raises :class:`Unavailable` when the connection is
        lost, :class:`TooLarge` for a call over :data:`FRAME_MAX`."""
        if self.closed:
            raise Unavailable("the connection to the hub's writer was lost")
        ref = next(self._refs)
        data = frame(_encoder.encode(make(ref)))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[ref] = future
        future.add_done_callback(lambda _: self._pending.pop(ref, None))
        try:
            self._writer.write(data)
        except (ConnectionError, OSError) as e:
            self._lost(e)
            raise Unavailable(f"the connection to the hub's writer was lost: {e}") from e
        return future

    async def answer(self, future: asyncio.Future[Answer]) -> Answer:
        """The reply of a call :meth:`send` wrote. Raises :class:`Unavailable` when the
        connection is lost first or it does not come within :data:`CALL_TIMEOUT_S`."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await self._writer.drain()
                return await asyncio.shield(future)
        except TimeoutError as e:  # (before OSError: it is one)
            future.cancel()
            raise Unavailable(f"the hub's writer did not answer within {CALL_TIMEOUT_S:g} s") from e
        except (ConnectionError, OSError) as e:
            self._lost(e)
            raise Unavailable(f"the connection to the hub's writer was lost: {e!r}") from e

    async def call(self, make: Callable[[int], msgspec.Struct]) -> Answer:
        return await self.answer(self.send(make))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why: BaseException | str = "the hub's writer closed the connection"
        try:
            while (body := await read_frame(reader)) is not None:
                if len(body) <= _DECODE_ON_LOOP_MAX:
                    reply = _replies.decode(body)
                else:
                    reply = await asyncio.to_thread(_replies.decode, body)
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
                    Unavailable(f"the connection to the hub's writer was lost: {why!r}")
                )
                future.exception()  # (retrieved: a caller that gave up is not told twice)

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


class _RawCommit(msgspec.Struct, tag="commit", array_like=True, frozen=True):
    """A :class:`CommitCall` as sent: its ops encoded already (:func:`_calls_of`)."""

    ref: int
    ops: list[msgspec.Raw]


_CALL_RESERVE: Final = 64
"""Bytes a call adds around its ops (its tag, ref, brackets)."""


def _calls_of(
    batch: Sequence[WriteRequest], outcomes: list[WriteOutcome | None]
) -> list[tuple[list[int], list[msgspec.Raw]]]:
    """The batch's requests encoded, in calls of about :data:`FRAME_SOFT` bytes each: (the
    indexes of the requests, their ops) per call. A request larger than a frame is not sent:
    its outcome, :class:`TooLarge`, goes in ``outcomes`` at once."""
    calls: list[tuple[list[int], list[msgspec.Raw]]] = []
    size = 0
    for index, request in enumerate(batch):
        op = _encoder.encode(_op(request))
        if len(op) + _CALL_RESERVE > FRAME_MAX:
            outcomes[index] = TooLarge(
                f"an append of {len(op)} bytes to hand to the hub's writer; the limit is "
                f"{FRAME_MAX}",
                size=len(op),
                limit=FRAME_MAX,
            )
            continue
        if not calls or (calls[-1][0] and size + len(op) > FRAME_SOFT):
            calls.append(([], []))
            size = 0
        calls[-1][0].append(index)
        calls[-1][1].append(msgspec.Raw(op))
        size += len(op)
    return calls


class HandoffStore(SqliteEventStore):
    """A :class:`SqliteEventStore` of a worker of ``agora serve --workers``: reads the file
    itself, hands every write to the :class:`HandoffServer` at ``socket`` (module doc). The
    file must exist with this code's schema (the writer makes and migrates it; this store
    never creates it). Everything else is a :class:`SqliteEventStore`'s; :meth:`tree_head`
    answers None (the trees are cached by the writer, in the supervisor)."""

    def __init__(self, path: Path, *, socket: Path, blobs_dir: Path | None = None) -> None:
        super().__init__(path, blobs_dir=blobs_dir)
        self.socket = socket
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._released = False
        # While follow() runs: the ranges of the commits it was answered for, and the batch
        # being handed meanwhile (set once its commits are recorded).
        self._own: OwnRanges | None = None
        self._handing: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"HandoffStore({str(self.path)!r}, socket={str(self.socket)!r})"

    async def _open(self) -> None:
        # mode=rw: never create the file (the writer makes and migrates it).
        target = f"{(await asyncio.to_thread(self.path.absolute)).as_uri()}?mode=rw"
        await self._open_reading(target, uri=True, how="(the hub's writer migrates it)")
        self._released = False
        try:
            self._link = await _Link.connect(self.socket)
        except BaseException:
            await super()._release()
            raise
        self._commits.start(self._commit, name=f"agora-handoff:{self.path}")

    async def _release(self) -> None:
        async with self._connecting:  # (after a reconnection under way)
            self._released = True
            link, self._link = self._link, None
        if link is not None:
            await link.aclose()
        await super()._release()

    async def _connected(self) -> _Link:
        """The live connection, or a new one after a lost one. Raises :class:`Unavailable`
        once the store is released (while it closes, pending batches are still handed)."""
        link = self._link
        if link is not None and not link.closed:
            return link
        async with self._connecting:
            if self._released:
                raise Unavailable("the store is not open")
            link = self._link
            if link is None or link.closed:
                if link is not None:
                    await link.aclose()
                self._link = link = await _Link.connect(self.socket)
            return link

    async def _call(self, make: Callable[[int], msgspec.Struct]) -> bool | int | None:
        if not self._commits.accepting:
            raise Unavailable("the store is not open")
        reply = await (await self._connected()).call(make)
        if type(reply) is Failed:
            raise raised(reply.error)
        if type(reply) is not Value:
            raise Internal(f"the hub's writer answered {type(reply).__name__} to a call")
        return reply.value

    # -- the group commit's batches ------------------------------------------------------------

    async def _commit(self, batch: list[WriteRequest]) -> None:
        handing = self._handing = asyncio.get_running_loop().create_future()
        try:
            try:
                outcomes = await self._hand(batch)
            except asyncio.CancelledError:  # (the loop is ending) its callers hear, as ever
                self._commits.settle(batch, [Unavailable("the store stopped") for _ in batch])
                raise
            except Exception as e:  # the store's errors, or a bug: every caller hears
                error = e if isinstance(e, AgoraError) else Internal(f"handing failed: {e!r}")
                outcomes = [raised(carried(error)) for _ in batch]  # an error each
            own = self._own
            if own is not None:
                own.extend(_ranges(outcomes))
            self._commits.settle(batch, outcomes)
        finally:
            handing.set_result(None)
            if self._handing is handing:
                self._handing = None

    async def _hand(self, batch: list[WriteRequest]) -> list[WriteOutcome]:
        """The outcome of each request of ``batch``, handed in one call or a few (sent in
        order, awaited together; each call answers for its own requests only)."""
        link = await self._connected()
        outcomes: list[WriteOutcome | None] = [None] * len(batch)
        calls = _calls_of(batch, outcomes)
        sent: list[tuple[list[int], asyncio.Future[Answer] | AgoraError]] = []
        for indexes, ops in calls:
            try:
                sent.append((indexes, link.send(functools.partial(_RawCommit, ops=ops))))
            except AgoraError as e:
                sent.append((indexes, e))
        for indexes, future in sent:
            try:
                if isinstance(future, AgoraError):
                    raise future
                reply = await link.answer(future)
                if type(reply) is Failed:
                    raise raised(reply.error)
                if type(reply) is not Outcomes or len(reply.outcomes) != len(indexes):
                    raise Internal(f"the hub's writer answered {len(indexes)} writes wrongly")
                for index, outcome in zip(indexes, reply.outcomes, strict=True):
                    outcomes[index] = _outcome(outcome, batch[index])
            except AgoraError as e:
                for index in indexes:
                    outcomes[index] = raised(carried(e))
        return [
            o if o is not None else Internal("the hub's writer gave no outcome") for o in outcomes
        ]

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

    def _track_own(self, own: OwnRanges) -> None:
        self._own = own

    def _untrack_own(self, own: OwnRanges) -> None:
        if self._own is own:
            self._own = None

    async def _own_recorded(self) -> None:
        """A commit the poll just read may be one whose answer has not come back yet: wait
        for the batch being handed (batches are handed one at a time) to be recorded. One
        handed after the read cannot be in it."""
        handing = self._handing
        if handing is not None:
            await asyncio.wait([handing])


def _ranges(outcomes: Sequence[WriteOutcome]) -> list[tuple[int, int]]:
    """The (first, last) positions of the events ``outcomes`` appended, adjacent ones merged."""
    ranges: list[tuple[int, int]] = []
    for outcome in outcomes:
        if type(outcome) is AppendResult and not outcome.duplicate and outcome.events:
            first, last = outcome.events[0].position, outcome.events[-1].position
            if ranges and ranges[-1][1] + 1 == first:
                ranges[-1] = (ranges[-1][0], last)
            else:
                ranges.append((first, last))
    return ranges


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
