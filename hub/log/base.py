"""The :class:`EventStore` interface every log store implements (SQLite, PostgreSQL).

Vocabulary (the same in SQL columns, Struct fields, CLI flags and docs): *workspace*, *seq*
(1-based, gapless per workspace), *position* (global append order), *event*, *kind*,
*payload*, *producer*, *head* (the last seq of a workspace).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import os
import stat
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Final, NamedTuple, Protocol, Self, TypeVar

from hub.core.chain import ChainWalk
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import BadRequest, IntegrityError, TooLarge
from hub.core.events import Event, encode_event
from hub.core.merkle import MappingReader, frontier_indexes
from hub.core.records import AppendResult, Head, JoinedPage, Snapshot, VerifyReport

_Page = TypeVar("_Page")

CommitObserver = Callable[[int, float, bool], None]
"""Told (requests committed, seconds, whether the transaction raised) after each one."""

CommitListener = Callable[[Sequence[AppendResult]], None]
"""Told, on the event loop, the appends one transaction committed (new events only: no
duplicate answer), in log order, as soon as its outcome is known and before any caller of
those appends resumes (:meth:`EventStore.hear_commits`)."""

CHECK_CHUNK: Final = 1024 * 1024
"""Bytes read at a time while a blob's hash is checked."""


class CommitHint(Protocol):
    """What :meth:`EventStore.follow` calls after each commit of another writer."""

    def __call__(self, workspace: str, head: int, carried: bytes | None = None, /) -> None: ...


class AppendItem(NamedTuple):
    """One :meth:`EventStore.append` call of an :meth:`EventStore.append_many`: its drafts,
    and its ``expected_seq`` and ``reads`` (see :meth:`EventStore.append`)."""

    drafts: Sequence[Event]
    expected_seq: int | None = None
    reads: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class TreeHead:
    """A workspace's tree as the store itself last committed it, known without reading
    (:meth:`EventStore.tree_head`): its ``size`` (the head seq), its ``root`` hash, and its
    ``lineage`` (hub.log.writer.TreeTip): two heads of one workspace with the same lineage
    are a tree and an extension of it, grown in this process's memory with nothing reloaded
    between them."""

    size: int
    root: bytes
    lineage: int


@dataclass(frozen=True, slots=True)
class BlobIntent:
    """A publish's durable note, written before it stores inline content as a blob: event
    ``event_id`` of ``workspace`` will reference blob ``sha256`` (``size`` bytes).
    ``stamp`` (microseconds since the epoch) is when it was written, and the stored time a
    blob created for it carries (``put(..., stamp=)``); a blob used again since (put,
    committed, touched) has a later stored time. A start sweeps the intents a crash left
    (:meth:`hub.workspaces.Workspaces.sweep_orphans`)."""

    workspace: str
    event_id: str
    sha256: str
    size: int
    stamp: int


def stamp_before(seconds: float) -> int:
    """``seconds`` since the epoch as a :class:`BlobIntent` stamp bound (microseconds),
    clamped to a BIGINT (``math.inf``: every intent)."""
    return int(min(max(seconds, 0.0), 9.2e12) * 1_000_000)


def _open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file at ``path``, never through a symbolic link
    (``O_NOFOLLOW``) and never a device or a FIFO (``O_NONBLOCK`` so opening one does not
    block; the ``fstat`` of the descriptor itself decides). Raises ``OSError``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def _hash_fd(fd: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := os.pread(fd, CHECK_CHUNK, size):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


class BlobStore(abc.ABC):
    """Content-addressed storage (sha256, lowercase hex) for large file content and artifacts.

    ``max_bytes``: the largest blob a store takes (set by each implementation)."""

    max_bytes: int

    def _check_size(self, size: int) -> None:
        """Refuse an upload's declared ``size``: negative, or over :attr:`max_bytes`."""
        if size < 0:
            raise BadRequest("a blob's size is not negative", field="$.size")
        if size > self.max_bytes:
            raise TooLarge(
                f"blob is {size} bytes; the limit is {self.max_bytes}",
                field="$.size",
                size=size,
                limit=self.max_bytes,
            )

    @abc.abstractmethod
    async def put(self, data: bytes, *, stamp: int | None = None) -> str:
        """Store ``data`` durably; return its sha256. Idempotent. A blob stored already is
        touched (:meth:`touch`); a new one's stored time is ``stamp`` (a :class:`BlobIntent`'s,
        in microseconds since the epoch) when given, else now."""

    @abc.abstractmethod
    async def get(self, sha256: str) -> bytes:
        """Return the content. Raises :class:`hub.core.errors.NotFound`."""

    @abc.abstractmethod
    async def has(self, sha256: str) -> bool: ...

    # -- streaming (the wire's putBlob/getBlob, docs/protocol.md "Blobs") ---------------------
    # A blob is written in chunks into an *upload* named by its (sha256, size), committed once
    # whole (hashed by the store, never trusted from the client), and read back in ranges, so
    # neither side ever holds a whole blob in memory.

    @abc.abstractmethod
    async def size(self, sha256: str) -> int:
        """The stored blob's size in bytes. Raises :class:`hub.core.errors.NotFound`."""

    @abc.abstractmethod
    async def read(self, sha256: str, offset: int, length: int) -> bytes:
        """At most ``length`` bytes of the blob from ``offset`` (fewer at its end). Raises
        :class:`hub.core.errors.NotFound`, ``BadRequest`` for an offset beyond the end."""

    # An upload belongs to its *uploader* (the agent; "" for the hub itself): another agent
    # announcing the same (sha256, size) writes its own upload, never this one's bytes.

    @abc.abstractmethod
    async def upload_offset(self, sha256: str, size: int, *, uploader: str = "") -> int:
        """Begin (or resume) ``uploader``'s upload of blob ``sha256`` of ``size`` bytes;
        return how many bytes from the start it already holds (where the client resumes). A
        stored blob is uploaded again all the same: the upload proves the uploader holds it."""

    @abc.abstractmethod
    async def write_chunk(
        self, sha256: str, size: int, offset: int, data: bytes, *, uploader: str = ""
    ) -> int:
        """Write ``data`` at ``offset`` of the upload (``offset`` at most what it holds: a
        resent chunk is written again, harmlessly); return the bytes it now holds. Raises
        ``NotFound`` for no such upload, ``BadRequest`` for a gap or a chunk past ``size``."""

    @abc.abstractmethod
    async def commit(
        self, sha256: str, size: int, *, uploader: str = "", stamp: int | None = None
    ) -> None:
        """Hash the whole upload and store it as the blob (hashed where no writer reaches
        it, so the bytes stored are the bytes hashed). A blob stored already is touched; a
        new one's stored time is ``stamp`` (a :class:`BlobIntent`'s) when given, as in
        :meth:`put`. Raises ``BadRequest`` while bytes are missing, and (the upload then
        discarded) when its content does not hash to ``sha256``."""

    # -- grants: which workspace may reference which blob (docs/protocol.md "Blobs") ------

    @abc.abstractmethod
    async def grant(self, workspace: str, sha256: str, size: int, agent: str) -> None:
        """Record that ``agent`` stored blob ``sha256`` (``size`` bytes) for ``workspace``:
        the workspace may now reference it, and it counts against its quota. Idempotent."""

    @abc.abstractmethod
    async def grants(self, workspace: str) -> dict[str, int]:
        """The blobs granted to ``workspace`` → their sizes."""

    @abc.abstractmethod
    def list_grants(self) -> AsyncIterator[tuple[str, str, float]]:
        """Every grant as (workspace, sha256, epoch seconds it was granted) (``agora blobs
        gc``)."""

    @abc.abstractmethod
    async def revoke(self, workspace: str, sha256: str) -> bool:
        """Drop the grant of ``sha256`` to ``workspace``; whether it was there."""

    @abc.abstractmethod
    async def delete(self, sha256: str) -> bool:
        """Remove the blob; whether it was there (``agora blobs gc``)."""

    @abc.abstractmethod
    def list(self) -> AsyncIterator[tuple[str, int, float]]:
        """Every stored blob as (sha256, size, epoch seconds it was stored)."""

    @abc.abstractmethod
    async def purge_uploads(self, before: float) -> int:
        """Drop the uploads last written before ``before`` (epoch seconds), never committed
        (``agora blobs gc``); return how many."""

    # -- intents: a publish's blobs until its event is committed (orphan sweep) -----------

    @abc.abstractmethod
    async def touch(self, sha256: str) -> bool:
        """Mark a stored blob used again: its stored time moves strictly forward (past any
        :class:`BlobIntent` stamp of an earlier moment, whatever the clocks say). Whether it
        is stored (nothing is done when it is absent). Every path that finds a blob stored
        already and goes on to reference it (``put``, ``commit``, ``put_file``) touches it,
        so the orphan sweep never removes a blob someone else took up meanwhile."""

    @abc.abstractmethod
    async def intend(self, workspace: str, event_id: str, sha256: str, size: int) -> BlobIntent:
        """Durably record (before the blob is stored) that event ``event_id`` of
        ``workspace`` will reference blob ``sha256``; return the intent, stamped now."""

    @abc.abstractmethod
    async def intents(self, before: float) -> tuple[BlobIntent, ...]:
        """The intents stamped before ``before`` (epoch seconds)."""

    @abc.abstractmethod
    async def settle(self, intent: BlobIntent) -> None:
        """Drop the intent (its event was committed, or its blob was swept). Idempotent."""

    @abc.abstractmethod
    async def delete_untouched(self, sha256: str, stamp: int) -> bool:
        """Remove the blob if its stored time is not after ``stamp`` (nothing stored or
        touched it since the intent of that stamp created it); whether it was removed."""

    async def put_file(
        self, path: Path, *, intend: Callable[[str, int], Awaitable[int | None]] | None = None
    ) -> tuple[str, int]:
        """Store the file at ``path`` chunk by chunk (hashed first, then uploaded and checked
        on commit), never whole in memory; return its (sha256, size). ``intend(sha256,
        size)``, awaited once the file is hashed instead of the touch of a stored blob, is how
        a writer guards a new blob with its :class:`BlobIntent` (hub.log.intents): it answers
        ``None`` when nothing is to be stored (it touched the stored blob, or stored it
        itself), else the stamp the new blob is stored with. Raises ``OSError`` (not a regular
        file)."""
        # One descriptor, opened without following links, for the hash and every read: the
        # path cannot be swapped for a link to another file between them (a sandbox writes
        # under it while the hub collects).
        fd = await asyncio.to_thread(_open_regular, path)
        try:
            size, sha256 = await asyncio.to_thread(_hash_fd, fd)
            stamp: int | None = None
            if intend is not None:
                stamp = await intend(sha256, size)
                if stamp is None:
                    return sha256, size
            elif await self.touch(sha256):  # referenced again: no orphan sweep may take it
                return sha256, size
            # An upload of its own: two collections of the same hash at once (one file
            # changing under it) never write into one upload.
            me = f".hub-{uuid.uuid4().hex}"
            offset = await self.upload_offset(sha256, size, uploader=me)
            while offset < size:
                part = await asyncio.to_thread(os.pread, fd, CHECK_CHUNK, offset)
                if not part:
                    break  # the file shrank meanwhile: the commit refuses it
                offset = await self.write_chunk(sha256, size, offset, part, uploader=me)
            await self.commit(sha256, size, uploader=me, stamp=stamp)
            return sha256, size
        finally:
            os.close(fd)

    async def check(self, sha256: str) -> None:
        """Read the whole blob in ranges and check it hashes to its name (``agora verify``).
        Raises ``NotFound``, :class:`IntegrityError`."""
        total = await self.size(sha256)
        digest = hashlib.sha256()
        offset = 0
        while offset < total:
            part = await self.read(sha256, offset, CHECK_CHUNK)
            if not part:
                break
            digest.update(part)
            offset += len(part)
        if offset != total or digest.hexdigest() != sha256:
            raise IntegrityError(f"blob {sha256} does not match its hash", sha256=sha256)


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


_MAX_RANGE_SEQ: Final = 2**63 - 1
"""The end of an unbounded range walk (:func:`read_ranges`): beyond any seq."""


def _joined_count(page: JoinedPage) -> int:
    return page.count


def _joined_last(page: JoinedPage) -> int:
    return page.last_seq


async def _read_ahead(
    fetch: Callable[[int], Awaitable[_Page]],
    after_seq: int,
    batch: int,
    count: Callable[[_Page], int],
    last_seq: Callable[[_Page], int],
) -> AsyncGenerator[_Page, None]:
    """The pages ``fetch(after)`` gives from ``after_seq`` on, each one's query started while
    the caller works on the one before (:meth:`EventStore.pages`); the walk ends after a
    page of fewer than ``batch`` events."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    ahead = asyncio.ensure_future(fetch(after_seq))
    try:
        while True:
            page = await ahead
            if count(page) < batch:
                yield page
                return
            ahead = asyncio.ensure_future(fetch(last_seq(page)))
            await asyncio.sleep(0)  # let the read ahead start before the caller works
            yield page
    finally:
        # A read ahead nobody needed: its failure is nobody's (marked retrieved even if
        # this wait is itself cancelled), and it is waited for so no task outlives us.
        ahead.add_done_callback(_retrieved)
        if not ahead.done():
            ahead.cancel()
            await asyncio.wait([ahead])


async def read_ranges(
    fetch_range: Callable[[int, int, int], Awaitable[JoinedPage]],
    fetch: Callable[[int], Awaitable[JoinedPage]],
    after_seq: int,
    until_seq: int | None,
    batch: int,
    slots: int,
) -> AsyncGenerator[JoinedPage, None]:
    """:func:`_read_ahead` over ``slots`` readers at once: page *i* is the range of seqs
    (``after_seq + i·batch``, ``+ batch``], fetched by ``fetch_range(lo, hi, slot)`` while
    the caller works on the pages before it, ``slots`` of them in flight (seqs are gapless, so
    a range holds exactly ``batch`` events until the head). The first range that holds fewer
    ends the walk, after one ``fetch(hi)`` (seq > hi, ``batch`` at most) finds nothing past
    it; if it does find events (a gap: a damaged log, which the caller's checks name), the
    walk goes on as :func:`_read_ahead` from there, so every stored event is still read."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    end = _MAX_RANGE_SEQ if until_seq is None else until_seq
    ranges: deque[tuple[int, asyncio.Future[JoinedPage]]] = deque()
    next_lo, slot = after_seq, 0

    def start() -> None:
        nonlocal next_lo, slot
        if next_lo < end:
            hi = min(next_lo + batch, end)
            ranges.append((hi, asyncio.ensure_future(fetch_range(next_lo, hi, slot))))
            slot = (slot + 1) % slots
            next_lo = hi

    try:
        for _ in range(slots):
            start()
        lo = after_seq
        while ranges:
            hi, future = ranges.popleft()
            page = await future
            if page.count == hi - lo:  # the whole range: read the next one ahead
                start()
                await asyncio.sleep(0)  # let it start before the caller works
                yield page
                lo = hi
                continue
            yield page
            if hi == end:
                return
            tail = await fetch(hi)
            if tail.count:
                yield tail
                if tail.count == batch:
                    async with contextlib.aclosing(
                        _read_ahead(fetch, tail.last_seq, batch, _joined_count, _joined_last)
                    ) as rest:
                        async for more in rest:
                            yield more
            return
    finally:
        # Ranges nobody needed: their failures are nobody's, and they are waited for so no
        # task outlives the walk.
        waiting = [f for _, f in ranges]
        for f in waiting:
            f.add_done_callback(_retrieved)
            f.cancel()
        if waiting:
            await asyncio.wait(waiting)


class EventStore(abc.ABC):
    """A durable, append-only, hash-chained log of events, partitioned by workspace.

    Use as ``async with store:`` (or ``await store.open()`` / ``await store.close()``;
    ``close`` is idempotent and waits for pending appends to commit).
    """

    blobs: BlobStore
    shared: ClassVar[bool] = False
    """Whether other processes (hub nodes) may append to this log too, so that a node must
    :meth:`follow` it to hear of their events. False for SQLite (one hub owns the file)."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def open(self) -> None: ...

    def observe_commits(self, observer: CommitObserver) -> None:
        """Tell ``observer`` (requests, seconds, failed) after each transaction of the store's
        group-commit writer (:mod:`hub.log.writer`; the metrics). A store without one: never."""
        commits = getattr(self, "_commits", None)
        if commits is not None:
            commits.observer = observer

    def hear_commits(self, listener: CommitListener) -> None:
        """Call ``listener`` with the new events of each transaction of the store's
        group-commit writer, on the loop, before the appends' callers resume (the callers
        wake a loop iteration later, or more: a subscriber need not wait for them). Listeners
        are called in the order they were added; one that raises is logged and the others
        still hear. A store without a group-commit writer: never. Appends of other processes
        or nodes are not heard here (:meth:`follow`)."""
        commits = getattr(self, "_commits", None)
        if commits is not None:
            commits.listeners.append(listener)

    @abc.abstractmethod
    async def close(self) -> None: ...

    # -- writing ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def append(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        expected_seq: int | None = None,
        reads: frozenset[str] | None = None,
    ) -> AppendResult:
        """Append ``drafts`` atomically; return the stored events once durably committed.

        Assigns ``seq``, ``position``, ``timestamp``, ``prev``, ``hash`` and an ``id`` where the
        draft has none; keeps the draft's ``producer`` (the caller sets it from authentication).
        Raises :class:`hub.core.errors.Conflict` (``details['head']``) when ``expected_seq`` is not
        the current head, or when a batch mixes ids already written with new ones;
        ``reads``, with ``expected_seq``: the kinds of events the batch was decided on
        (hub.core.rules.decide.kinds_read) — when the head has moved past ``expected_seq`` by
        events of other kinds only (checked in the append's own transaction), the batch is
        appended after them instead (another node's flood of messages does not make a work-item
        claim stale); None: any event past ``expected_seq`` refuses it;
        :class:`hub.core.errors.BadRequest` for an empty batch or an id repeated in it;
        :class:`hub.core.errors.Unavailable` when the store is not open or the batch could not be
        committed (then nothing of it was written). A batch whose ids were all written before
        returns the original result with ``duplicate=True`` and writes nothing. A caller
        cancelled while waiting may still see its batch committed (the retry with the same ids
        then answers ``duplicate``).
        """

    async def append_many(
        self, workspace: str, items: Sequence[AppendItem]
    ) -> list[AppendResult | Exception]:
        """Several :meth:`append` calls to ``workspace`` (an :class:`AppendItem` each),
        started in order and awaited together; one outcome per item, in order (its result or
        the error that refused it alone). A store with a group-commit writer queues them at
        once and wakes the caller once (:meth:`hub.log.writer.GroupCommit.append_many`); this
        default starts one task per item, in order."""
        outcomes = await asyncio.gather(
            *(
                self.append(workspace, drafts, expected_seq=seq, reads=reads)
                for drafts, seq, reads in items
            ),
            return_exceptions=True,
        )
        results: list[AppendResult | Exception] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                raise outcome  # a cancellation is not an outcome
            results.append(outcome)
        return results

    @abc.abstractmethod
    async def import_events(self, workspace: str, events: Sequence[Event]) -> int:
        """Restore exported events verbatim (same seq, id, timestamp, hashes) into an empty
        workspace; positions are the store's own. Returns the number imported.

        ``events`` must be the whole log of ``workspace`` from seq 1, with every event's
        ``workspace`` equal to ``workspace`` (an export is restored under its own name).
        Raises :class:`hub.core.errors.BadRequest` otherwise,
        :class:`hub.core.errors.IntegrityError`
        naming the first bad seq if the chain does not verify, :class:`hub.core.errors.Conflict` if
        the workspace already has events, :class:`hub.core.errors.Unavailable` as ``append``.
        """

    # -- reading ----------------------------------------------------------------------------

    @abc.abstractmethod
    async def read_batch(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int = 1000,
    ) -> list[Event]:
        """Up to ``limit`` events with ``after_seq < seq <= until_seq``, in seq order."""

    @abc.abstractmethod
    async def read_raw(
        self, workspace: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[tuple[int, bytes]]:
        """Like :meth:`read_batch` but the stored JSON bytes, verbatim and unchecked (``agora
        export`` copies a damaged log as it is); a door that hands them on checks them
        (:meth:`hub.workspaces.Workspaces.read_raw`)."""

    @abc.abstractmethod
    async def lookup_ids(self, workspace: str, ids: Sequence[str]) -> dict[str, Event]:
        """The stored events of ``workspace`` among ``ids`` (id → event; missing ids absent).

        Lets the hub answer a retried publish whose rules fail only because it was applied."""

    @abc.abstractmethod
    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[Event]:
        """Up to ``limit`` events of every workspace with ``position > after_position``, in
        position order, never one below a position that may still commit: a follower that
        reads on from the last position it got skips nothing. A page may come shorter than
        ``limit``, or empty, while events follow it (PostgreSQL returns only what is below
        its horizon, docs/operations.md, "Ordering"): a short page is not the end."""

    @abc.abstractmethod
    async def head(self, workspace: str) -> Head | None:
        """The workspace's head, or None if it has no events."""

    @abc.abstractmethod
    async def heads(self) -> list[Head]:
        """Every workspace's head, ordered by workspace name."""

    async def workspaces(self) -> list[str]:
        return [h.workspace for h in await self.heads()]

    async def read(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        batch: int = 5000,
    ) -> AsyncGenerator[Event, None]:
        """Every event after ``after_seq`` (up to ``until_seq``), fetched in batches (read
        ahead: :meth:`pages`; close it with ``contextlib.aclosing`` when stopping early)."""
        async with contextlib.aclosing(
            self.pages(workspace, after_seq=after_seq, until_seq=until_seq, batch=batch)
        ) as pages:
            async for page in pages:
                for ev in page:
                    yield ev

    def pages(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        batch: int = 5000,
    ) -> AsyncGenerator[list[Event], None]:
        """The events after ``after_seq`` (up to ``until_seq``) as :meth:`read_batch` pages
        of ``batch`` (the last one shorter, possibly empty; none after a short one).

        Read ahead by one page: the next page's query is already running (in the store's
        reader thread, or on the server) while the caller works on this one, so a long walk
        costs about the larger of reading and processing rather than their sum. At most two
        pages are held. Use it in ``contextlib.aclosing`` when the walk may stop early: the
        read ahead is then cancelled. Raises ``ValueError`` if ``batch < 1`` and what
        :meth:`read_batch` raises, in page order.
        """

        def fetch(after: int) -> Awaitable[list[Event]]:
            return self.read_batch(workspace, after_seq=after, until_seq=until_seq, limit=batch)

        return _read_ahead(fetch, after_seq, batch, len, lambda page: page[-1].seq)

    async def read_joined(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        limit: int = 1000,
    ) -> JoinedPage:
        """The events :meth:`read_batch` gives, as one JSON array of their stored bodies (the
        replay fold decodes only what it reads: :func:`hub.core.projections.workspace.
        fold_stored`). This default encodes :meth:`read_batch`'s events; the stores join the
        stored bytes without decoding them. Raises ``IntegrityError`` for a row nested deeper
        than readers accept (naming it), otherwise what :meth:`read_batch` raises."""
        page = await self.read_batch(
            workspace, after_seq=after_seq, until_seq=until_seq, limit=limit
        )
        body = b"[" + b",".join(map(encode_event, page)) + b"]"
        return JoinedPage(body=body, count=len(page), last_seq=page[-1].seq if page else after_seq)

    def joined_pages(
        self,
        workspace: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        batch: int = 5000,
    ) -> AsyncGenerator[JoinedPage, None]:
        """:meth:`pages`, as :meth:`read_joined` pages (read ahead the same way). Raises
        ``ValueError`` if ``batch < 1`` and what :meth:`read_joined` raises, in page order."""

        def fetch(after: int) -> Awaitable[JoinedPage]:
            return self.read_joined(workspace, after_seq=after, until_seq=until_seq, limit=batch)

        return _read_ahead(fetch, after_seq, batch, _joined_count, _joined_last)

    # -- following other writers ------------------------------------------------------------

    async def follow(self, notify: CommitHint, *, resumed: Callable[[], None]) -> None:
        """Report appends committed by every writer of this log until cancelled.

        ``notify(workspace, head, carried)`` is called (synchronously, from the event loop)
        after each commit, with the workspace's new head: a hint to read the log after what
        the caller has. ``carried``, when not None, is that commit's events of the workspace
        as stored, ``[body,…]`` (the seqs up to ``head``, in order), so the caller need not
        read them back; it is a convenience, never the only way: decode it as a read of the
        store (it may be absent, and a caller that cannot use it reads the log).
        ``resumed()`` is called whenever following (re)starts; hints may have been missed
        before it, so the caller re-reads every workspace it serves.
        Connection loss is retried, never raised. The default, for a store no other process
        writes (:attr:`shared` false), has nothing to report and returns at once.
        """
        return

    # -- snapshots (disposable caches) ------------------------------------------------------

    @abc.abstractmethod
    async def save_snapshot(self, snapshot: Snapshot) -> None: ...

    @abc.abstractmethod
    async def load_snapshot(
        self, workspace: str, name: str, version: int, *, at_or_before: int | None = None
    ) -> Snapshot | None:
        """The newest snapshot of that name and version with ``seq <= at_or_before``."""

    @abc.abstractmethod
    async def delete_snapshots(self, workspace: str | None = None) -> int: ...

    # -- the Merkle tree and checkpoints (docs/audit.md) -----------------------------------
    #
    # The stored hashes (hub.core.merkle) are derived data, written by the writer in the same
    # transaction as the events they cover; checkpoints are what the hub signed, kept so that
    # it can hand them (and their cosignatures) out again.

    @abc.abstractmethod
    async def read_hash_map(self, workspace: str, indexes: Sequence[int]) -> dict[int, bytes]:
        """The stored Merkle hashes among ``indexes`` (index → hash; missing ones absent)."""

    def tree_head(self, workspace: str) -> TreeHead | None:
        """The workspace's tree as this store last committed it, from memory (no I/O), or
        None when the store does not know it without reading: the default, and PostgreSQL's
        answer (other nodes append too). A store that caches each workspace's tree between
        its own commits (SQLite) answers here, so a checkpoint needs no round trip
        (hub.checkpoints.Checkpointer). What it answers is a tree this store committed, never
        one it merely read; the head on disk may be ahead of it (another process appended)."""
        return None

    async def read_hashes(self, workspace: str, indexes: Sequence[int]) -> MappingReader:
        """A :class:`hub.core.merkle.HashReader` holding the stored hashes at ``indexes``.
        Raises :class:`IntegrityError` naming the first index that is not stored."""
        found = await self.read_hash_map(workspace, indexes)
        for index in indexes:
            if index not in found:
                raise IntegrityError(
                    f"stored Merkle hash {index} of {workspace!r} is missing",
                    workspace=workspace,
                    index=index,
                )
        return MappingReader(found)

    @abc.abstractmethod
    async def rebuild_hashes(self, workspace: str) -> int:
        """Recompute ``workspace``'s stored hashes from its events, replacing any stored
        ones, with appends to it held off meanwhile; return the tree size (its head seq).
        Raises :class:`IntegrityError` for a gap in the log, :class:`Unavailable`."""

    async def ensure_hashes(self, workspace: str) -> int:
        """The workspace's tree size, first building its stored hashes if they are missing
        (a log written before the tree existed: built lazily, here or at its next append).
        Raises as :meth:`rebuild_hashes`."""
        head = await self.head(workspace)
        if head is None:
            return 0
        indexes = frontier_indexes(head.seq)
        found = await self.read_hash_map(workspace, indexes)
        if all(i in found for i in indexes):
            return head.seq
        return await self.rebuild_hashes(workspace)

    @abc.abstractmethod
    async def save_checkpoint(self, record: CheckpointRecord) -> bool:
        """Keep a checkpoint; return False (keeping the first) when one of that workspace and
        size is already kept. Raises :class:`Unavailable`."""

    @abc.abstractmethod
    async def set_cosignatures(self, workspace: str, size: int, cosignatures: str) -> None:
        """Replace the cosignature lines of a kept checkpoint. Raises
        :class:`hub.core.errors.NotFound` when there is none of that size."""

    @abc.abstractmethod
    async def load_checkpoint(
        self, workspace: str, size: int | None = None
    ) -> CheckpointRecord | None:
        """The kept checkpoint of ``size``, or the largest when ``size`` is None."""

    @abc.abstractmethod
    async def list_checkpoints(self, workspace: str) -> list[CheckpointRecord]:
        """Every kept checkpoint of ``workspace``, smallest first."""

    # -- audit ------------------------------------------------------------------------------

    async def verify(self, workspace: str, *, until_seq: int | None = None) -> VerifyReport:
        """Walk the workspace's chain (up to ``until_seq``) a page at a time; report the first
        broken link, gap or duplicate (``head``: the last seq that checks out). Raises
        :class:`IntegrityError` for a stored event that does not decode."""
        walk = ChainWalk()
        async with contextlib.aclosing(self.pages(workspace, until_seq=until_seq)) as pages:
            async for page in pages:
                if walk.check(page) is not None:
                    break
        return VerifyReport(
            workspace=workspace, checked=walk.checked, head=walk.head, error=walk.error
        )
