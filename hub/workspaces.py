"""Live workspaces: the decide → append → evolve pipeline every write goes through.

The server, the runtime and ``agora append`` all publish through :class:`Workspaces`, so the
same validation and the same rules apply whoever writes.

Why two states per workspace. Appends are group-committed: many publishers' batches share one
transaction, so a workspace can have several batches in flight at once. Each batch is decided
against the *tentative* state (committed state plus every batch accepted but not yet
committed) and appended with ``expected_seq`` = the tentative head, which keeps the store's
order and the decision order identical. Readers (``state``, fan-out) only ever see the
*committed* state, folded from the events the store returned once they were durable.

If a batch fails in the store (I/O error, a retried id that was already written, or another
hub node appending to the same workspace) the tentative state is no longer a prediction of
the log. The workspace is then *resynced*: new publishes wait until the in-flight batches have
settled, the committed state catches up from the store, and the tentative state restarts from
it. Batches that failed because of the resync are decided again (a bounded number of times).

A connection's pipelined publishes (:meth:`Workspaces.publish_many`) are decided in one pass,
each against the tentative state the ones before it leave, exactly as one :meth:`publish`
each would be, and handed to the store as one group (:meth:`EventStore.append_many`): one
request per publish, queued contiguously as one entry, one future and one wait for them all;
what they committed is folded and announced to the listeners at once. What one pass cannot settle
(file writes and artifacts, a refusal to check against the log, a resync) goes through
:meth:`Workspaces.publish` in its turn.

Several hub nodes on one store (PostgreSQL). Each node's Workspaces only sees its own appends;
:meth:`Workspaces.catch_up` feeds the events other nodes committed (hub.cluster.follower calls it
on each NOTIFY) through the same committed path, so listeners still get every event once, in
seq order, whoever wrote it. The committed path drops events it has already folded, which is
what makes the catch-up, the resync and this node's own append results safe to overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

import msgspec

from hub.core.backoff import Backoff
from hub.core.capability import SYSTEM_WORKSPACE
from hub.core.errors import (
    BadRequest,
    ClientError,
    Conflict,
    Forbidden,
    IntegrityError,
    Internal,
    NotFound,
    TooLarge,
    Unavailable,
)
from hub.core.events import HUB_KINDS, OP_KINDS, ArtifactPublished, Event, FileWritten
from hub.core.projections.snapshots import DEFAULT_SNAPSHOT_EVERY
from hub.core.projections.workspace import FileEntry, WorkspaceState, evolve
from hub.core.records import AppendResult
from hub.core.rules.decide import decide, kinds_read
from hub.core.validation import (
    DEFAULT_LIMITS,
    Limits,
    check_event_bounds,
    check_event_size,
    file_content,
    validate_draft,
    validate_workspace,
)
from hub.log.base import AppendItem, EventStore
from hub.log.codec import UNDECODABLE, check_depth, decode_joined
from hub.log.ids import mint_id
from hub.log.intents import BlobStaging, sweep_intents
from hub.log.loading import load_state, save_snapshot_if_due

if TYPE_CHECKING:  # OpenTelemetry is loaded only when tracing is on (hub.observe.tracing)
    from hub.observe.tracing import Tracing

log = logging.getLogger(__name__)

Listener = Callable[[str, Sequence[Event]], None]

# How often a batch is decided again after its workspace resynced under it.
MAX_REDECIDE = 8
# The random back-off before deciding again after another writer's append: from 0.5 ms,
# doubling, each a uniform fraction of it (full jitter), bounded by the attempts.
REDECIDE_BACKOFF: Final = Backoff(
    initial=0.0005, maximum=0.0005 * 2 ** (MAX_REDECIDE - 1), jitter=1.0, give_up_after=None
)
# Events read from the store per page by a catch-up.
CATCH_UP_PAGE: Final = 1000
# How long a catch-up waits for this node's own in-flight batch before reading the store.
OWN_COMMIT_GRACE_S: Final = 0.1


class _PendingBlob(msgspec.Struct, frozen=True):
    """Inline content a publish moves to the blob store once its batch is decided, for the
    event ``event_id`` (the intent that guards it names the event)."""

    content: bytes
    sha256: str
    event_id: str


class _Live:
    """One open workspace. Touched only from the event loop."""

    __slots__ = (
        "advanced",
        "blob_index",
        "committed",
        "in_flight",
        "name",
        "needs_resync",
        "resyncing",
        "settled",
        "stash",
        "tentative",
    )

    def __init__(self, name: str, state: WorkspaceState) -> None:
        self.name = name
        self.committed = state
        self.tentative = state.clone()
        self.in_flight = 0
        self.needs_resync = False
        self.resyncing = 0  # publishes waiting in _resync
        self.settled = asyncio.Event()
        self.settled.set()
        # Set whenever ``committed`` moves on or ``in_flight`` drops to 0 (catch_up waits on it).
        self.advanced = asyncio.Event()
        # Committed batches that arrived ahead of an earlier one, keyed by first seq.
        self.stash: dict[int, tuple[Event, ...]] = {}
        # The blobs ``committed`` references and the bytes it holds, as of a seq (a getBlob
        # per chunk asks: no walk over every file each time).
        self.blob_index: _BlobIndex | None = None

    def landed(self) -> None:
        """One append handed to the store came back (committed or not): the last one in
        flight settles the workspace and wakes ``catch_up``."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self.settled.set()
            self.advanced.set()


class _Decided(NamedTuple):
    """One batch of :meth:`Workspaces.publish_many` decided in a run: its index, its prepared
    drafts, the tentative head it was decided on, whether it must land right after it, and
    what the store may let it land after instead (:func:`_tolerated`)."""

    at: int
    drafts: list[Event]
    base: int
    ordered: bool
    reads: frozenset[str] | None


def _tolerated(
    live: _Live, kinds: frozenset[str], expected_seq: int | None
) -> frozenset[str] | None:
    """The ``reads`` to give the store for a batch decided now on ``live.tentative`` that reads
    ``kinds`` of the state (hub.core.rules.decide.kinds_read): those kinds when the decision
    read the *committed* state (nothing of this node in flight before it), so that every event
    of the log up to its base is one it saw and any later one of another kind (another node's
    messages) cannot change it: the store then appends it after them instead of refusing it.
    None (any later event refuses it) for a batch decided on a prediction, and for a client's
    own ``expectedSeq``, which means the head it names."""
    if not kinds or expected_seq is not None or live.in_flight:
        return None
    return kinds if live.tentative.seq == live.committed.seq else None


class _Publishing(NamedTuple):
    """What the parts of one :meth:`Workspaces.publish_many` share: its arguments, and the
    outcome of each batch as it is known."""

    workspace: str
    batches: Sequence[tuple[Sequence[Event], int | None]]
    producer: str
    results: list[AppendResult | Exception | None]


_SLOW: Final = frozenset({FileWritten, ArtifactPublished})
"""The kinds whose publish may store blobs and checks the quota (:meth:`Workspaces.publish`
alone). Exact types: event kinds are final Structs."""


def _first_slow(batches: Sequence[tuple[Sequence[Event], int | None]], start: int) -> int:
    """The index of the first batch from ``start`` with a file write or an artifact, else
    the number of batches."""
    for index in range(start, len(batches)):
        for draft in batches[index][0]:
            if type(draft) in _SLOW:
                return index
    return len(batches)


class _BlobIndex:
    """Blob → how many files and artifacts reference it, and the bytes they hold, of one
    committed state (its ``seq``)."""

    __slots__ = ("refs", "seq", "used")

    def __init__(self, state: WorkspaceState) -> None:
        self.seq = state.seq
        self.refs: dict[str, int] = {}
        self.used = 0
        for e in state.files.values():
            self.used += max(0, e.size)
            if e.blob:
                self.refs[e.blob] = self.refs.get(e.blob, 0) + 1
        for a in state.artifacts.values():
            self.used += a.size_bytes
            if a.blob:
                self.refs[a.blob] = self.refs.get(a.blob, 0) + 1


_NO_SPAN: Final = contextlib.nullcontext()


def _carried_events(workspace: str, joined: bytes) -> tuple[Event, ...] | None:
    """The events a notification carried (``[body,…]``), decoded as a read of the store is
    (the same depth limit), or None unless they are events of ``workspace`` with
    consecutive seqs."""
    try:
        events = decode_joined(joined)
    except UNDECODABLE:
        return None
    if not events:
        return None
    first = events[0].seq
    for offset, event in enumerate(events):
        if event.workspace != workspace or event.seq != first + offset:
            return None
    return tuple(events)


def _refusal(workspace: str, reason: str) -> Unavailable:
    """What a request for a quarantined workspace gets."""
    return Unavailable(
        f"workspace {workspace!r} is quarantined: {reason}", workspace=workspace, quarantined=reason
    )


class Workspaces:
    """Decides, appends and folds every write; tells listeners about committed events.

    ``listeners`` are called synchronously, in seq order per workspace, with each committed
    batch; they must not block (the server's fan-out only enqueues). ``keep_open(workspace)``:
    true for a workspace that must stay open beyond ``max_open`` (one with subscribers, whose
    events from other nodes arrive only while it is open).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        limits: Limits = DEFAULT_LIMITS,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        max_open: int = 4096,
        keep_open: Callable[[str], object] | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.snapshot_every = snapshot_every
        self.max_open = max_open
        self.keep_open = keep_open
        self._live: dict[str, _Live] = {}
        self._opening: dict[str, asyncio.Future[_Live]] = {}
        self._listeners: list[Listener] = []
        self._snapshot_tasks: set[asyncio.Task[bool]] = set()
        # The seq of the last snapshot the store holds, per workspace (save_snapshot_if_due).
        self._snapshots_saved: dict[str, int] = {}
        self.tracing: Tracing | None = None
        """Where a publish's ``agora.decide``, ``agora.append`` and ``agora.fanout`` spans go
        (set by the hub when tracing is on): children of the caller's span (``agora.publish``)."""
        self.quarantined: dict[str, str] = {}
        """Workspaces whose recovery failed at start (hub.runtime.recovery; with workers, the
        supervisor's, loaded from the recovery index) or whose log could not be read back
        (:meth:`quarantine_unreadable`), with why: refused with ``unavailable``
        (``details.quarantined``) while the hub serves every other."""

    def quarantine(self, workspace: str, reason: str) -> None:
        self.quarantined[workspace] = reason
        self._live.pop(workspace, None)

    def quarantine_unreadable(self, workspace: str, error: IntegrityError) -> Unavailable:
        """Quarantine ``workspace`` because its log cannot be read back (``error``: an event
        from before the nesting limit, a broken chain), as a failed recovery is, and return
        the ``Unavailable`` to raise from ``error``: such a log is refused with the reason,
        never answered ``internal`` on every request. Recovery does not read every workspace
        (the index; on a shared store or with workers, another process's), so the first read
        of it, by whichever part of the hub, is where such a log is found."""
        reason = f"reading the log failed: IntegrityError: {error}"[:500]
        log.error("workspace %s quarantined: %s", workspace, reason)
        self.quarantine(workspace, reason)
        return _refusal(workspace, reason)

    def refuse_quarantined(self, workspace: str) -> None:
        """Raise ``Unavailable`` (details ``workspace``, ``quarantined``: the reason) for a
        quarantined workspace."""
        reason = self.quarantined.get(workspace)
        if reason is not None:
            raise _refusal(workspace, reason)

    # -- listeners ----------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    # -- reads --------------------------------------------------------------------------------

    async def read_batch(
        self, workspace: str, *, after_seq: int = 0, until_seq: int | None = None, limit: int
    ) -> list[Event]:
        """The store's :meth:`~hub.log.base.EventStore.read_batch`, as every door reads a log
        (a subscriber's follow, the journals, the A2A tasks): a quarantined workspace is
        refused, and one whose page cannot be read back is quarantined
        (:meth:`quarantine_unreadable`) rather than answered ``internal``. Raises
        ``Unavailable``."""
        self.refuse_quarantined(workspace)
        try:
            return await self.store.read_batch(
                workspace, after_seq=after_seq, until_seq=until_seq, limit=limit
            )
        except IntegrityError as e:
            raise self.quarantine_unreadable(workspace, e) from e

    async def read_raw(
        self, workspace: str, *, after_seq: int = 0, limit: int
    ) -> list[tuple[int, bytes]]:
        """The store's :meth:`~hub.log.base.EventStore.read_raw` for a subscription's
        catch-up, which hands the bytes on undecoded: checked as a decoding read checks them
        (:func:`hub.log.codec.check_depth`: an event from before the nesting bound), refused
        and quarantined as :meth:`read_batch`. Raises ``Unavailable``."""
        self.refuse_quarantined(workspace)
        page = await self.store.read_raw(workspace, after_seq=after_seq, limit=limit)
        try:
            check_depth([body for _, body in page], [seq for seq, _ in page], "seq")
        except IntegrityError as e:
            raise self.quarantine_unreadable(workspace, e) from e
        return page

    async def state(self, workspace: str, *, at_seq: int | None = None) -> WorkspaceState:
        """The committed state, now or at ``at_seq`` (time travel). Raises ``BadRequest``."""
        validate_workspace(workspace)
        live = await self._open(workspace)
        if at_seq is not None and at_seq > live.committed.seq:
            await self.catch_up(workspace)  # another node may have written up to it
        if at_seq is None or at_seq >= live.committed.seq:
            return live.committed.clone()
        if at_seq < 0:
            raise BadRequest("atSeq must be >= 0", field="atSeq")
        return await load_state(self.store, workspace, at_seq=at_seq)

    async def files(self, workspace: str) -> dict[str, FileEntry]:
        """The committed files (a copy of the mapping; entries are immutable). Cheaper than
        :meth:`state`, which copies everything, executions and work items included."""
        validate_workspace(workspace)
        live = await self._open(workspace)
        return dict(live.committed.files)

    async def _blob_index(self, workspace: str) -> _BlobIndex:
        validate_workspace(workspace)
        live = await self._open(workspace)
        index = live.blob_index
        if index is None or index.seq != live.committed.seq:
            index = live.blob_index = _BlobIndex(live.committed)
        return index

    async def references_blob(self, workspace: str, sha256: str) -> bool:
        """Whether the committed state of ``workspace`` references blob ``sha256`` (a file's
        content or an artifact): what lets a reader of the workspace download it."""
        return sha256 in (await self._blob_index(workspace)).refs

    async def may_reference(self, workspace: str, sha256: str) -> bool:
        """Whether a publish to ``workspace`` may reference blob ``sha256``: the workspace
        references it already, or it was uploaded (bytes sent and hashed) for it, a *grant*.
        Knowing a hash is not enough: that would open another workspace's content."""
        if await self.references_blob(workspace, sha256):
            return True
        return sha256 in await self.store.blobs.grants(workspace)

    async def stored_bytes(self, workspace: str) -> int:
        """The bytes the workspace holds now (its quota's usage): its files and artifacts,
        and the blobs granted to it (uploaded for it) that nothing references yet, until
        ``agora blobs gc`` drops those grants."""
        used = (await self._blob_index(workspace)).used
        return used + sum((await self._unreferenced_grants(workspace)).values())

    async def _unreferenced_grants(self, workspace: str) -> dict[str, int]:
        refs = (await self._blob_index(workspace)).refs
        grants = await self.store.blobs.grants(workspace)
        return {sha: n for sha, n in grants.items() if sha not in refs}

    async def check_quota(self, workspace: str, size: int) -> None:
        """Raise :class:`TooLarge` when ``size`` more bytes would take ``workspace`` over
        ``[limits] max_workspace_bytes``."""
        quota = self.limits.max_workspace_bytes
        used = await self.stored_bytes(workspace)
        if used + size > quota:
            raise TooLarge(
                f"workspace {workspace!r} holds {used} bytes; {size} more would pass its quota "
                f"of {quota} (max_workspace_bytes)",
                field="$.size",
                limit=quota,
                used=used,
                size=size,
            )

    async def _check_batch_quota(self, workspace: str, prepared: list[Event]) -> None:
        """The bytes a batch adds (files and artifacts, less what they replace; a blob
        granted and not yet referenced is counted already) must fit the quota."""
        if not any(isinstance(e, FileWritten | ArtifactPublished) for e in prepared):
            return
        committed = (await self._open(workspace)).committed
        counted = await self._unreferenced_grants(workspace)
        added = 0
        for event in prepared:
            blob: str | None
            if isinstance(event, FileWritten):
                blob, size = event.payload.blob, max(0, event.payload.size or 0)
                old = committed.files.get(event.payload.path)
                replaced = max(0, old.size) if old is not None else 0
            elif isinstance(event, ArtifactPublished):
                blob, size = event.payload.blob, event.payload.size_bytes
                prior = committed.artifacts.get(event.payload.key)
                replaced = prior.size_bytes if prior is not None else 0
            else:
                continue
            if blob is not None and counted.pop(blob, None) is not None:
                replaced += size  # its grant paid for it already
            added += size - replaced
        if added > 0:
            await self.check_quota(workspace, added)

    async def head(self, workspace: str, *, at_least: int | None = None) -> int:
        """The last committed seq (0 for an empty workspace). When it is below ``at_least``
        (a seq a client saw on another node), catch up from the store first."""
        live = await self._open(workspace)
        if at_least is not None and at_least > live.committed.seq:
            await self.catch_up(workspace)
        return live.committed.seq

    def open_head(self, workspace: str) -> int | None:
        """The committed seq of an open workspace, 0 while it is being opened, None when it is
        not open here (then its events reach nobody until it is opened from the log)."""
        live = self._live.get(workspace)
        if live is not None:
            return live.committed.seq
        return 0 if workspace in self._opening else None

    def open_workspaces(self) -> list[str]:
        """The workspaces open (or being opened) on this node."""
        return [*self._live, *(w for w in self._opening if w not in self._live)]

    # -- writes -------------------------------------------------------------------------------

    async def publish(
        self,
        workspace: str,
        drafts: Sequence[Event],
        *,
        producer: str,
        expected_seq: int | None = None,
        trusted: bool = False,
        submitted: asyncio.Future[None] | None = None,
        staged: BlobStaging | None = None,
    ) -> AppendResult:
        """Validate, decide and durably append ``drafts`` as one atomic batch.

        ``producer`` is the authenticated agent and overrides whatever the drafts say.
        ``trusted`` is for the hub itself (presence, runtime); clients may not write the
        hub's kinds. Raises ``BadRequest``/``TooLarge`` (invalid), ``Forbidden``, ``Conflict``
        (stale ``expected_seq``/``baseRev``, ownership), ``NotFound``, ``Unavailable``.
        A batch whose ids were all written before returns the original result with
        ``duplicate=True``.

        ``submitted`` (an ordering hook) gets its result once the batch's place in the log is
        decided and the batch is handed to the store: a publish started after that is decided,
        and appended, after this one. When the publish ends before (refused, duplicate,
        failed) it is left alone: the caller settles it. (The server chains one connection's
        publishes to a workspace on it.)

        ``staged``: the staging of a larger write this batch is part of (the runtime's record
        of a run, which stored the run's artifacts through it): the batch's inline content is
        stored through it too, and settling its intents is left to its owner.
        """
        validate_workspace(workspace)
        if not drafts:
            raise BadRequest("a batch needs at least one event", field="events")
        if not trusted and workspace == SYSTEM_WORKSPACE:
            raise Forbidden(
                f"{SYSTEM_WORKSPACE!r} is the hub's system workspace; only the hub writes there",
                workspace=workspace,
            )
        prepared: list[Event] = []
        # Content to move to the blob store: stored only once the batch is decided, so a
        # refused publish writes nothing. Each new blob is guarded by a durable intent written
        # before it (hub.log.base.BlobIntent): settled once the append committed, swept at
        # once when the batch is refused after all, and swept at the next start when a crash
        # came between the two (:meth:`sweep_orphans`).
        pending_blobs: list[_PendingBlob] = []
        for i, draft in enumerate(drafts):
            if not trusted and (draft.kind in HUB_KINDS or draft.kind in OP_KINDS):
                raise Forbidden(
                    f"events of kind {draft.kind!r} are written by the hub, not published",
                    kind=draft.kind,
                    index=i,
                )
            try:
                validate_draft(draft, self.limits)
                ready = await self._prepare(
                    draft, workspace, producer, pending_blobs, trusted=trusted
                )
                check_event_size(ready, self.limits)
                prepared.append(ready)
            except ClientError as e:
                e.details.setdefault("index", i)
                raise

        if not trusted:
            # The hub's own writes (a run's pulled files, artifacts) are bounded where they
            # are collected; refusing them here would lose a finished run's record.
            await self._check_batch_quota(workspace, prepared)
        kinds = kinds_read(prepared)
        ordered = expected_seq is not None or bool(kinds)
        if staged is not None:
            if staged.workspace != workspace:
                raise ValueError(
                    f"a staging for {staged.workspace!r} cannot store for {workspace!r}"
                )
            return await self._decide_and_append(
                workspace,
                prepared,
                producer,
                expected_seq=expected_seq,
                ordered=ordered,
                kinds=kinds,
                submitted=submitted,
                pending_blobs=pending_blobs,
                staged=staged,
            )
        # Refused (a client error: nothing of this batch was appended), its new blobs go as
        # the staging closes (unless the same ids were written by a retry meanwhile, or
        # another publish took them up). An error of the store (unavailable, cancelled)
        # leaves the intents: whether the append committed is not known here; the sweep
        # finds out.
        async with BlobStaging(self.store, workspace) as staged:
            result = await self._decide_and_append(
                workspace,
                prepared,
                producer,
                expected_seq=expected_seq,
                ordered=ordered,
                kinds=kinds,
                submitted=submitted,
                pending_blobs=pending_blobs,
                staged=staged,
            )
            # Committed: the publish succeeded, and must say so (a retry without an id would
            # publish again), whether or not its intents could be dropped.
            await staged.committed()
        return result

    async def _decide_and_append(
        self,
        workspace: str,
        prepared: list[Event],
        producer: str,
        *,
        expected_seq: int | None,
        ordered: bool,
        kinds: frozenset[str],
        submitted: asyncio.Future[None] | None,
        pending_blobs: list[_PendingBlob],
        staged: BlobStaging,
    ) -> AppendResult:
        """The decide → (store blobs) → append loop of :meth:`publish`; the blobs are stored
        through ``staged`` (each new one under its intent)."""
        for attempt in range(MAX_REDECIDE):
            live = await self._open(workspace)
            # A batch decided without reading the state need not wait for the tentative state
            # to be repaired, unless a publish that needs it is repairing it (which waits for
            # the batches in flight to settle: new ones wait with it, or it could starve).
            while live.needs_resync and (ordered or live.resyncing):
                await self._resync(live)
            try:
                with self._span("agora.decide", workspace):
                    decide(live.tentative, prepared, producer)
                if expected_seq is not None and expected_seq != live.tentative.seq:
                    raise Conflict(
                        f"expectedSeq {expected_seq} but the head is {live.tentative.seq}",
                        head=live.tentative.seq,
                        expectedSeq=expected_seq,
                    )
            except (Conflict, Forbidden, NotFound):
                # A retried batch may fail its rules only because it was already applied.
                original = await self._find_written(workspace, prepared)
                if original is not None:
                    return original
                if live.in_flight or live.needs_resync:
                    # Decided against a prediction; check against the log before refusing.
                    await live.settled.wait()
                    if live.needs_resync:
                        continue
                if await self.catch_up(workspace):
                    continue  # another node had moved the workspace on: decide again
                raise
            if pending_blobs:
                # Decided: store the content now, then decide again (the state may have moved
                # while the blobs were written; the next round has no await before append).
                for blob in pending_blobs:
                    await staged.put(blob.event_id, blob.content, sha256=blob.sha256)
                pending_blobs.clear()
                continue
            result = await self._append(
                live,
                prepared,
                ordered=ordered,
                reads=_tolerated(live, kinds, expected_seq),
                submitted=submitted,
            )
            if result is not None:
                return result
            # Another writer got there first: back off a random moment (two nodes busy on
            # one workspace would otherwise keep colliding in step).
            await asyncio.sleep(REDECIDE_BACKOFF.delay(attempt))
        raise Conflict(
            f"workspace {workspace!r} kept changing under this batch; retry",
            head=self._live[workspace].committed.seq if workspace in self._live else 0,
        )

    async def sweep_orphans(self, *, before: float) -> int:
        """Settle the blob intents stamped before ``before`` (epoch seconds) that a crash
        left between storing a publish's blob and committing its event; return how many
        blobs were removed. Bounded by the intents (publishes in flight at the crash), never
        a scan of a log or of the blob store. The hub runs it in the background from its
        start and every ``ORPHAN_GRACE_S`` (hub.server.app), beside serving: ``before`` must
        leave in-flight publishes (of every process on the store) their grace. The
        intents are those of every writer that stores blobs (hub.log.intents)."""
        return await sweep_intents(self.store, await self.store.blobs.intents(before))

    async def publish_many(
        self,
        workspace: str,
        batches: Sequence[tuple[Sequence[Event], int | None]],
        *,
        producer: str,
        submitted: asyncio.Future[None] | None = None,
    ) -> list[AppendResult | Exception]:
        """Several publishes to ``workspace`` by ``producer``, ``(drafts, expected_seq)`` each,
        in order: a connection's pipelined publishes. Returns one outcome per batch, in order:
        its :class:`AppendResult`, or the error that refused it alone.

        Each batch is validated, decided and appended exactly as :meth:`publish` would do it
        after the ones before it (its own rules against the state they leave, its own
        ``expected_seq``, its own ids and duplicate answer), but the run of them that can be
        decided at once is decided in one pass, with no wait between two, and handed to the
        store as one group (:meth:`EventStore.append_many`): the caller wakes once for them
        all, not once per batch. A batch that one pass cannot settle alone goes through
        :meth:`publish` in its turn, after the run before it is stored: file writes and
        artifacts (blobs to store, references and the quota to check), one the rules refuse
        (checked against the log first, as :meth:`publish` does), one waiting for a resync,
        and one the store sent back to be decided again. ``submitted``: as :meth:`publish`,
        set once the last batch is handed to the store. Not traced (the caller publishes one
        by one when tracing is on, for a span per publish)."""
        count = len(batches)
        results: list[AppendResult | Exception | None] = [None] * count
        publishing = _Publishing(workspace, batches, producer, results)
        loop = asyncio.get_running_loop()
        # Parts still in flight (tasks, only when the batches need more than one part: file
        # writes, artifacts, refusals); the next part is decided once the one before has its
        # place in the log (``handed``), the order publish keeps with ``submitted``.
        started: list[asyncio.Task[None]] = []
        try:
            index = 0
            while index < count:
                live = self._live.get(workspace)  # (publish opens it, or it was closed)
                if live is not None and (end := _first_slow(batches, index)) > index:
                    stop: list[int] = []
                    if end >= count and not started:  # the common case: one run, no task
                        await self._run_part(live, index, end, None, submitted, stop, publishing)
                    else:
                        step: asyncio.Future[None] = loop.create_future()
                        part = self._run_part(live, index, end, step, submitted, stop, publishing)
                        task = loop.create_task(part)
                        started.append(task)
                        # Its first step decides and queues the run (with no wait between
                        # the two, so the log's order is the decision's), then sets step.
                        await asyncio.wait([step, task], return_when=asyncio.FIRST_COMPLETED)
                    if stop[0] > index:
                        index = stop[0]
                        continue
                # The batch the pass stopped at, alone through publish.
                alone, index = index, index + 1
                last = index >= count
                if last and not started:
                    await self._publish_into(alone, submitted, publishing)
                    break
                handed = submitted if last else loop.create_future()
                task = loop.create_task(self._publish_into(alone, handed, publishing))
                started.append(task)
                if not last and handed is not None:
                    await asyncio.wait([handed, task], return_when=asyncio.FIRST_COMPLETED)
            if started:
                await asyncio.wait(started)
        except asyncio.CancelledError:
            for task in started:
                task.cancel()
            raise
        return [r if r is not None else Internal("a publish was left undecided") for r in results]

    async def _run_part(
        self,
        live: _Live,
        start: int,
        end: int,
        handed: asyncio.Future[None] | None,
        submitted: asyncio.Future[None] | None,
        stop: list[int],
        publishing: _Publishing,
    ) -> None:
        """One run of :meth:`publish_many`: decide ``batches[start:end]`` (where it stopped goes
        into ``stop``), store what was decided as one group (``handed`` set as it is queued;
        ``submitted`` instead when the run ends the batches), then decide again, one by one,
        the batches the store sent back (another writer appended first), as :meth:`publish`
        retries, after the same random back-off."""
        run, index = self._decide_run(live, start, end, publishing)
        stop.append(index)
        if not run:
            return
        live.in_flight += 1
        live.settled.clear()
        last = index >= len(publishing.batches)
        again = await self._append_run(live, run, submitted if last else handed, publishing.results)
        if again:
            await asyncio.sleep(REDECIDE_BACKOFF.delay(0))
            for at in again:
                await self._publish_into(at, None, publishing)

    async def _publish_into(
        self, index: int, submitted: asyncio.Future[None] | None, publishing: _Publishing
    ) -> None:
        """``batches[index]`` through :meth:`publish`, its outcome into ``results``."""
        drafts, expected_seq = publishing.batches[index]
        try:
            publishing.results[index] = await self.publish(
                publishing.workspace,
                drafts,
                producer=publishing.producer,
                expected_seq=expected_seq,
                submitted=submitted,
            )
        except Exception as e:
            publishing.results[index] = e

    def _decide_run(
        self, live: _Live, start: int, end: int, publishing: _Publishing
    ) -> tuple[list[_Decided], int]:
        """Decide ``batches[start:end]`` against the tentative state, one after the other, with
        no wait: the run of them decided and the index it stopped at (one :meth:`publish` must
        take, or ``end``). A batch refused before its decision (invalid) gets its error in
        ``results`` and is skipped, as :meth:`publish` raises it before deciding anything."""
        workspace, batches, producer = publishing.workspace, publishing.batches, publishing.producer
        results = publishing.results
        run: list[_Decided] = []
        index = start
        for index in range(start, end):
            drafts, expected_seq = batches[index]
            try:
                prepared = self._prepare_now(workspace, drafts, producer)
            except Exception as e:
                results[index] = e
                continue
            if prepared is None:
                return run, index
            kinds = kinds_read(prepared)
            reads = bool(kinds)
            ordered = expected_seq is not None or reads
            if live.needs_resync and (ordered or live.resyncing):
                return run, index
            tentative = live.tentative
            if reads:  # (drafts decide reads nothing for, it accepts whatever precedes them)
                try:
                    decide(tentative, prepared, producer)
                except (Conflict, Forbidden, NotFound):
                    return run, index  # publish checks a refusal against the log
                except Exception as e:
                    results[index] = e
                    continue
            if expected_seq is not None and expected_seq != tentative.seq:
                return run, index
            base = tentative.seq
            tolerated = _tolerated(live, kinds, expected_seq) if reads else None
            for d in prepared:
                evolve(tentative, msgspec.structs.replace(d, seq=tentative.seq + 1))
            # (no Python __new__)
            run.append(_Decided._make((index, prepared, base, ordered, tolerated)))
        else:
            index = end
        return run, index

    async def _append_run(
        self,
        live: _Live,
        run: list[_Decided],
        submitted: asyncio.Future[None] | None,
        results: list[AppendResult | Exception | None],
    ) -> list[int]:
        """Hand a decided run to the store as one group and fold what it committed, each batch
        as :meth:`_append` does; returns the indexes the store sent back to be decided again
        (another writer appended first). The caller counted the run in ``live.in_flight``."""
        if submitted is not None and not submitted.done():
            submitted.set_result(None)
        try:
            outcomes = await self.store.append_many(
                live.name,
                # (_make: no Python __new__ per publish)
                [AppendItem._make((d.drafts, d.base if d.ordered else None, d.reads)) for d in run],
            )
        except Exception as e:
            live.needs_resync = True
            outcomes = [e] * len(run)
        except BaseException:
            live.needs_resync = True
            raise
        finally:
            live.landed()
        again: list[int] = []
        # The run's new events are folded and announced together, one listener call per
        # contiguous stretch of them rather than one per publish (normally the whole run).
        stretch: list[Event] = []
        for decided, outcome in zip(run, outcomes, strict=True):
            index = decided.at
            if isinstance(outcome, Exception):
                live.needs_resync = True
                if isinstance(outcome, Conflict) and "head" in outcome.details:
                    again.append(index)
                else:
                    results[index] = outcome
                continue
            if outcome.duplicate or outcome.events[0].seq != decided.base + 1:
                live.needs_resync = True  # the tentative state did not predict the log
            results[index] = outcome
            if not outcome.duplicate:
                events = outcome.events
                if stretch and events[0].seq != stretch[-1].seq + 1:
                    self._committed(live, tuple(stretch))
                    stretch = []
                stretch.extend(events)
        if stretch:
            self._committed(live, tuple(stretch))
        return again

    def _prepare_now(
        self, workspace: str, drafts: Sequence[Event], producer: str
    ) -> list[Event] | None:
        """:meth:`publish`'s checks and preparation of a client's ``drafts`` when they need no
        wait (no file write or artifact: those may store blobs and count against the quota);
        None when they do. Raises what :meth:`publish` raises before deciding."""
        if not drafts:
            raise BadRequest("a batch needs at least one event", field="events")
        if workspace == SYSTEM_WORKSPACE:
            raise Forbidden(
                f"{SYSTEM_WORKSPACE!r} is the hub's system workspace; only the hub writes there",
                workspace=workspace,
            )
        prepared: list[Event] = []
        limits = self.limits
        for i, draft in enumerate(drafts):
            if type(draft) in _SLOW:
                return None
            if draft.kind in HUB_KINDS or draft.kind in OP_KINDS:
                raise Forbidden(
                    f"events of kind {draft.kind!r} are written by the hub, not published",
                    kind=draft.kind,
                    index=i,
                )
            try:
                validate_draft(draft, limits, depth=False)
                ready = _stamp(draft, workspace, producer)
                check_event_bounds(ready, limits)  # size and nesting: one encoding
            except ClientError as e:
                e.details.setdefault("index", i)
                raise
            prepared.append(ready)
        return prepared

    async def _append(
        self,
        live: _Live,
        drafts: list[Event],
        *,
        ordered: bool = True,
        reads: frozenset[str] | None = None,
        submitted: asyncio.Future[None] | None = None,
    ) -> AppendResult | None:
        """Append against the tentative head; None when the batch must be decided again.

        An ``ordered`` batch must land right after the state it was decided on, or after events
        of kinds other than ``reads`` only (:func:`_tolerated`); another one (see
        :func:`hub.core.rules.decide.reads_state`) may land after any events another node
        wrote meanwhile. ``submitted`` is set as the batch is handed to the store, whose
        first step queues the request before any task this wakes can run (as long as the
        store's queue keeps its callers in order)."""
        base = live.tentative.seq
        for d in drafts:
            evolve(live.tentative, msgspec.structs.replace(d, seq=live.tentative.seq + 1))
        live.in_flight += 1
        live.settled.clear()
        if submitted is not None and not submitted.done():
            submitted.set_result(None)
        try:
            with self._span("agora.append", live.name):
                result = await self.store.append(
                    live.name, drafts, expected_seq=base if ordered else None, reads=reads
                )
        except Conflict as e:
            live.needs_resync = True
            if "head" in e.details:
                return None  # another writer appended first: decide again on fresh state
            raise
        except BaseException:
            live.needs_resync = True
            raise
        finally:
            live.landed()
        if result.duplicate or result.events[0].seq != base + 1:
            live.needs_resync = True  # the tentative state did not predict the log
        if result.duplicate:
            return result
        with self._span("agora.fanout", live.name):
            self._committed(live, result.events)
        return result

    def _span(self, name: str, workspace: str) -> contextlib.AbstractContextManager[object]:
        """A child span of the current one when tracing is on; else a shared no-op."""
        tracing = self.tracing
        if tracing is None or not tracing.enabled:
            return _NO_SPAN
        return tracing.span(name, attributes={"agora.workspace": workspace})

    def heard(self, appended: Sequence[AppendResult]) -> None:
        """A commit listener (:meth:`EventStore.hear_commits`, added by the hub): the store
        committed ``appended``; fold them and tell the listeners now, in the loop callback
        the commit is reported in, rather than when each publisher's task resumes (one
        iteration later): a subscriber's wait is then the commit's, not its publishers'.
        The publishers' own fold of the same events (:meth:`_append_run`, :meth:`_append`)
        then finds them folded. One listener call per workspace's run of consecutive events
        in the transaction, as :meth:`_append_run` makes for a connection's run."""
        # One transaction writes each workspace's new events with consecutive seqs (its
        # refused and duplicate appends take none), so they join into one run.
        runs: dict[str, list[Event]] = {}
        for result in appended:
            if result.events and result.workspace in self._live:  # else: read when opened
                runs.setdefault(result.workspace, []).extend(result.events)
        for workspace, run in runs.items():
            live = self._live.get(workspace)
            if live is not None:  # (a listener may have closed it meanwhile)
                self._committed(live, tuple(run))

    def _committed(self, live: _Live, events: tuple[Event, ...]) -> None:
        head = live.committed.seq
        if events[-1].seq <= head:
            return  # already folded: read from the log by a catch-up or a resync
        if events[0].seq <= head:
            events = tuple(ev for ev in events if ev.seq > head)
        known = live.stash.get(events[0].seq)
        if known is None or len(known) < len(events):
            live.stash[events[0].seq] = events
        while live.stash:
            batch = live.stash.pop(live.committed.seq + 1, None)
            if batch is None:
                # A stashed batch may overlap what was folded since: keep only its new part.
                first = min(live.stash)
                if first > live.committed.seq + 1:
                    break
                batch = tuple(ev for ev in live.stash.pop(first) if ev.seq > live.committed.seq)
                if not batch:
                    continue
            for ev in batch:
                evolve(live.committed, ev)
            for listener in self._listeners:
                try:
                    listener(live.name, batch)
                except Exception:  # a broken listener must not break the log
                    log.exception("listener failed for %s", live.name)
            if self.snapshot_every and live.committed.seq % self.snapshot_every < len(batch):
                self._spawn_snapshot(live.committed)
        if live.committed.seq > head:
            live.advanced.set()

    def _spawn_snapshot(self, state: WorkspaceState) -> None:
        # The encoding happens now (a consistent copy); only the write is deferred. The write
        # is a disposable cache, so losing it on shutdown costs nothing but speed.
        snapshot = state.clone()
        task = asyncio.get_running_loop().create_task(
            save_snapshot_if_due(
                self.store, snapshot, every=self.snapshot_every, saved=self._snapshots_saved
            )
        )
        self._snapshot_tasks.add(task)
        task.add_done_callback(self._snapshot_tasks.discard)

    async def _resync(self, live: _Live) -> None:
        live.resyncing += 1
        try:
            await live.settled.wait()
            if not live.needs_resync:
                return
            async for ev in self.store.read(live.name, after_seq=live.committed.seq):
                self._committed(live, (ev,))
            live.tentative = live.committed.clone()
            live.stash.clear()
            live.needs_resync = False
        finally:
            live.resyncing -= 1

    async def catch_up(
        self, workspace: str, seq: int | None = None, carried: Sequence[bytes] = ()
    ) -> int:
        """Fold and announce the events other writers (hub nodes sharing the store) committed.

        Reads the log after the committed head (when ``seq``, the head a notification
        announced, is given: only if the head is below it) and runs the events through the
        committed path, so listeners get them in seq order and never twice; events this node
        committed itself are skipped. ``carried``: the events notifications carried
        (:meth:`EventStore.follow`), each ``[body,…]``, in the order heard: those that
        continue the committed head are folded without reading them back, and the log is
        read only for what they leave out (a page that does not decode, or does not
        continue the head, is left to that read). A workspace that is not open here is left
        alone (it is read from the log when opened). Returns how many events were folded.
        Raises ``Unavailable`` and ``IntegrityError`` from the store.
        """
        live = self._live.get(workspace)
        if live is None:
            if workspace not in self._opening:
                return 0
            live = await self._open(workspace)
        if seq is not None and live.in_flight and live.committed.seq < seq <= live.tentative.seq:
            # Most likely this node's own batch, whose result is on its way: wait a moment
            # rather than read it from the store too.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(OWN_COMMIT_GRACE_S):
                    while live.in_flight and live.committed.seq < seq:
                        live.advanced.clear()
                        await live.advanced.wait()
        if seq is not None and live.committed.seq >= seq:
            return 0
        before = live.committed.seq
        for joined in carried:
            events = _carried_events(workspace, joined)
            if events is None or events[0].seq > live.committed.seq + 1:
                break  # undecodable, or after a gap: the read below covers the rest
            self._committed(live, events)
        while seq is None or live.committed.seq < seq:
            page = await self.store.read_batch(
                workspace, after_seq=live.committed.seq, limit=CATCH_UP_PAGE
            )
            if page:
                self._committed(live, tuple(page))
            if len(page) < CATCH_UP_PAGE:
                break
        folded = live.committed.seq - before
        if folded:
            if live.in_flight == 0 and not live.needs_resync and not live.stash:
                live.tentative = live.committed.clone()
            else:
                live.needs_resync = True  # the tentative state missed these events
        return folded

    async def _find_written(self, workspace: str, drafts: list[Event]) -> AppendResult | None:
        ids = [d.id for d in drafts if d.id]
        if len(ids) != len(drafts):
            return None
        found = await self.store.lookup_ids(workspace, ids)
        if len(found) != len(ids):
            return None
        return AppendResult(
            workspace=workspace, events=tuple(found[i] for i in ids), duplicate=True
        )

    async def _prepare(
        self,
        draft: Event,
        workspace: str,
        producer: str,
        pending_blobs: list[_PendingBlob],
        *,
        trusted: bool = False,
    ) -> Event:
        """Set the authenticated producer; fill file hashes; mark large content for the blob
        store (appended to ``pending_blobs``, stored once the batch is decided); check that an
        artifact's blob exists and fill its ``sha256`` and ``sizeBytes`` from it (the hub's
        figures, never the client's)."""
        draft = _stamp(draft, workspace, producer)
        if isinstance(draft, ArtifactPublished):
            a = draft.payload
            if not a.blob:
                raise BadRequest("artifactPublished needs payload.blob", field="payload.blob")
            await self._check_reference(workspace, a.blob, trusted=trusted)
            size = await self.store.blobs.size(a.blob)  # never the whole blob in memory
            artifact = msgspec.structs.replace(a, sha256=a.blob, size_bytes=size)
            return msgspec.structs.replace(draft, payload=artifact)
        if not isinstance(draft, FileWritten):
            return draft
        p = draft.payload
        if p.blob is not None:
            await self._check_reference(workspace, p.blob, trusted=trusted)
            size = await self.store.blobs.size(p.blob)
            payload = msgspec.structs.replace(p, sha256=p.blob, size=size)
        else:
            content = file_content(p.text, p.base64, "payload.base64")
            digest = hashlib.sha256(content).hexdigest()
            if len(content) > self.limits.blob_threshold:
                if not draft.id:
                    # The blob's intent names its event: an id now, not the store's later.
                    draft = msgspec.structs.replace(draft, id=mint_id(int(time.time() * 1000)))
                pending_blobs.append(_PendingBlob(content, digest, draft.id))
                payload = msgspec.structs.replace(
                    p, text=None, base64=None, blob=digest, sha256=digest, size=len(content)
                )
            else:
                payload = msgspec.structs.replace(p, sha256=digest, size=len(content))
        return msgspec.structs.replace(draft, payload=payload)

    async def _check_reference(self, workspace: str, sha256: str, *, trusted: bool) -> None:
        """A client's reference needs :meth:`may_reference` (the hub's own, a stored blob)."""
        if trusted:
            ok = await self.store.blobs.has(sha256)
        else:
            ok = await self.may_reference(workspace, sha256) and await self.store.blobs.has(sha256)
        if not ok:
            # Not "forbidden": whether the blob exists elsewhere is not told.
            raise NotFound(
                f"workspace {workspace!r} holds no blob {sha256}: upload it first (putBlob)",
                field="payload.blob",
            )

    # -- opening ------------------------------------------------------------------------------

    async def _open(self, workspace: str) -> _Live:
        self.refuse_quarantined(workspace)
        live = self._live.get(workspace)
        if live is not None:
            return live
        pending = self._opening.get(workspace)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[_Live] = asyncio.get_running_loop().create_future()
        self._opening[workspace] = fut
        try:
            try:
                state = await load_state(self.store, workspace)
            except IntegrityError as e:
                raise self.quarantine_unreadable(workspace, e) from e
            live = _Live(workspace, state)
            self._evict_idle()
            self._live[workspace] = live
            fut.set_result(live)
            return live
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._opening[workspace]

    def _evict_idle(self) -> None:
        if len(self._live) < self.max_open:
            return
        keep = self.keep_open
        for name, live in list(self._live.items()):
            if live.in_flight == 0 and not live.needs_resync and not (keep and keep(name)):
                del self._live[name]
                if len(self._live) < self.max_open:
                    return

    async def aclose(self) -> None:
        """Wait for in-flight snapshot writes (appends are awaited by their publishers)."""
        if self._snapshot_tasks:
            await asyncio.gather(*self._snapshot_tasks, return_exceptions=True)


def _stamp(draft: Event, workspace: str, producer: str) -> Event:
    """A draft as the hub takes it: its authenticated producer and workspace, and nothing of
    its place in the log (the store fills that in)."""
    return msgspec.structs.replace(
        draft, producer=producer, workspace=workspace, seq=0, position=0, prev=None, hash=None
    )
