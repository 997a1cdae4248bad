"""The workspace API of a session: publish, read, state, files, adk-code's work-item verbs and
the waiters.

Design (the weak points of adk-code's collaboration API that this fixes):

- **Waiters read the log first.** Every waiter subscribes with ``afterSeq`` (0, a seq the caller
  knows, or the seq that opened the work item) and scans history before following live events,
  so an event published just before the wait is never missed.
- **Retries are idempotent.** Publishes carry client-minted UUID ids; requests in flight when a
  connection drops are sent again on the next one, and the hub answers a repeated id with the
  original seq and ``duplicate: true``.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import msgspec

from hub.client import blobs as blob_io
from hub.client.blobs import BlobSource, Progress
from hub.client.errors import SessionClosed
from hub.client.exec import WorkspaceRuntime
from hub.client.feed import Subscription
from hub.client.verify import SignedCheckpoint
from hub.core.backoff import Backoff
from hub.core.chain import canonical_bytes
from hub.core.checkpoint import NoteError, parse_checkpoint, parse_note
from hub.core.errors import BadRequest, Internal, NotFound, RateLimited, TamperDetected
from hub.core.events import (
    COLLABORATION_KINDS,
    AnyEvent,
    ArtifactPayload,
    ArtifactPublished,
    Blocked,
    Completed,
    Event,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.ids import RANDOM_BYTES, format_uuid7s
from hub.core.merkle import ProofError, check_inclusion, leaf_hash
from hub.core.projections.workspace import WorkspaceState
from hub.core.validation import DEFAULT_LIMITS
from hub.core.wire import frames

if TYPE_CHECKING:
    from hub.client.session import Session

__all__ = [
    "INDEX_SIZE",
    "MAX_RATE_LIMIT_WAIT",
    "RATE_LIMIT_RETRIES",
    "BatchAck",
    "PublishAck",
    "Workspace",
]

E = TypeVar("E", bound=Event)

RATE_LIMIT_RETRIES: Final = 8
"""How often a rate-limited publish is sent again (after the wait the hub asked for)."""

MAX_RATE_LIMIT_WAIT: Final = 5.0

INLINE_LIMIT: Final = DEFAULT_LIMITS.blob_threshold
"""File content above this many bytes goes up as a blob (the hub's default threshold)."""

TEXT_MEDIA_TYPE: Final = "text/plain; charset=utf-8"
"""The media type a large text file written without one gets, so it reads back as text."""
"""Seconds: the longest wait before sending a rate-limited publish again."""

INDEX_SIZE: Final = 4096
"""Work items whose topic and opening seq a :class:`Workspace` handle remembers."""

# Work-item kinds after which an item is no longer up for grabs (``wait_for_work``).
_TAKEN: Final = frozenset({"workClaimed", "completed", "workCancelled"})


def _event_id() -> str:
    """A new id for a published event: time-ordered (UUIDv7, :mod:`hub.core.ids`), as the
    hub mints its own, so the hub's id index grows at its end (random uuid4 ids cost the hub
    0.78-0.88x the acked rate, docs/operations.md "Ids")."""
    return format_uuid7s(time.time_ns() // 1_000_000, os.urandom(RANDOM_BYTES))[0]


class PublishAck(msgspec.Struct, frozen=True):
    """A single publish was appended (or, ``duplicate``, had been appended before) at ``seq``."""

    workspace: str
    seq: int
    id: str
    duplicate: bool = False


class BatchAck(msgspec.Struct, frozen=True):
    """An atomic batch was appended at ``seqs`` (one per event, in order)."""

    workspace: str
    seqs: list[int]
    ids: list[str]
    duplicate: bool = False


class Workspace:
    """One workspace through a session: publish, subscribe, state, files, work items.

    Every call raises what ended the session (:class:`~hub.core.errors.Unauthorized`,
    :class:`~hub.core.errors.Unavailable`, :class:`SessionClosed`) besides the errors it lists.
    """

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = name
        self.runtime = WorkspaceRuntime(self)
        """Executions in this workspace (docs/execution.md, "Runtime")."""
        # correlationId -> (topic, seq of the item's first event or 0 if unknown); bounded.
        self._items: OrderedDict[str, tuple[str | None, int]] = OrderedDict()

    def __repr__(self) -> str:
        return f"Workspace({self.name!r}, agent={self.session.agent!r})"

    # -- publishing ------------------------------------------------------------------------

    def _draft(self, event: Event | Mapping[str, Any]) -> Event:
        if isinstance(event, Mapping):
            try:
                event = msgspec.convert(dict(event), AnyEvent)
            except msgspec.ValidationError as e:
                raise BadRequest(f"not a valid event: {e}", field="event") from e
        if not isinstance(event, Event):
            raise BadRequest(f"expected an Event, got {type(event).__name__}", field="event")
        if event.seq:
            raise BadRequest("a draft must not carry a seq (the log assigns it)", field="seq")
        return msgspec.structs.replace(event, id=event.id or _event_id(), workspace=self.name)

    async def publish(
        self, event: Event | Mapping[str, Any], expected_seq: int | None = None
    ) -> PublishAck:
        """Append one event (a draft, or its JSON as a dict) and return its :class:`PublishAck`.

        A missing ``id`` is minted here (UUID), so a retry is idempotent. ``expected_seq``: the
        head this write is based on. Raises :class:`~hub.core.errors.BadRequest`/``TooLarge``
        (invalid), ``Forbidden`` (no write right, a hub-only kind, not the owner),
        ``Conflict`` (stale ``expected_seq``/``baseRev``, terminal or foreign work item;
        ``details['head']``), ``NotFound``, ``RateLimited`` (still limited after the
        retries, or at once when the session does not retry).
        """
        draft = self._draft(event)
        reply = await self._publish(
            frames.Publish(workspace=self.name, event=cast(Any, draft), expected_seq=expected_seq)
        )
        if not isinstance(reply, frames.Ack) or reply.seq is None:
            raise Internal(f"unexpected reply to publish: {type(reply).__name__}")
        return PublishAck(self.name, reply.seq, reply.id or draft.id, reply.duplicate)

    async def publish_batch(
        self, events: Iterable[Event | Mapping[str, Any]], expected_seq: int | None = None
    ) -> BatchAck:
        """Append ``events`` atomically (all or none). Raises as :meth:`publish`; an error's
        ``details['index']`` names the offending event."""
        drafts = [self._draft(e) for e in events]
        if not drafts:
            raise BadRequest("a batch needs at least one event", field="events")
        reply = await self._publish(
            frames.Publish(workspace=self.name, events=cast(Any, drafts), expected_seq=expected_seq)
        )
        if not isinstance(reply, frames.Ack) or reply.seqs is None:
            raise Internal(f"unexpected reply to publish: {type(reply).__name__}")
        ids = reply.ids if reply.ids is not None else [d.id for d in drafts]
        return BatchAck(self.name, list(reply.seqs), list(ids), reply.duplicate)

    async def _publish(self, frame: frames.Publish) -> frames.ServerFrame:
        """Send a publish; on ``rateLimited`` wait (the ``retryAfterMs`` the hub asked for,
        doubled on each attempt, with :class:`~hub.core.backoff.Backoff`'s jitter) and send it
        again, at most ``RATE_LIMIT_RETRIES`` times unless the session says not to retry."""
        attempt = 0
        while True:
            try:
                return await self.session.request(frame)
            except RateLimited as e:
                attempt += 1
                if not self.session.retry_rate_limited or attempt > RATE_LIMIT_RETRIES:
                    raise
                wait_ms = e.details.get("retryAfterMs", 100)
                wait = wait_ms / 1000 if isinstance(wait_ms, int | float) else 0.1
                # Publishers refused together must not come back together: back off, jitter.
                backoff = Backoff(
                    initial=max(0.001, wait), maximum=MAX_RATE_LIMIT_WAIT, give_up_after=None
                )
                await asyncio.sleep(backoff.delay(attempt - 1))

    async def _emit(self, draft: E, *, opens: bool = False) -> E:
        """Publish ``draft``; return it as stored (id, seq, workspace, producer filled in;
        timestamp and hash are in the log). ``opens``: it is the first event of its item."""
        prepared = cast(E, self._draft(draft))
        ack = await self.publish(prepared)
        stored = msgspec.structs.replace(
            prepared, id=ack.id, seq=ack.seq, producer=self.session.agent
        )
        self._note(stored, complete=opens)
        return stored

    # -- auditing (docs/audit.md) -----------------------------------------------------------

    async def checkpoint(self) -> SignedCheckpoint:
        """The latest signed checkpoint of the workspace's log (the hub signs one when none
        covers its head yet). On a verifying session (``connect(..., verify=True)``) it is
        checked against the pinned key and everything seen before: raises
        :class:`~hub.core.errors.TamperDetected` for a history that does not extend it.
        Raises ``NotFound`` for a workspace without events, ``Forbidden``."""
        reply = await self.session.request(frames.CheckpointQuery(workspace=self.name))
        frame = _checkpoint_reply(reply)
        verifier = self.session.verifier
        if verifier is None:
            try:
                parsed = parse_checkpoint(parse_note(frame.note).text)
            except NoteError as e:
                raise Internal(f"the hub sent a checkpoint that does not parse: {e}") from e
            return SignedCheckpoint(self.name, parsed, frame.note, frame.cosignatures)
        return await verifier.check(
            self.name, frame.note, frame.cosignatures, self.consistency_proof
        )

    async def consistency_proof(self, from_size: int, to_size: int) -> list[bytes]:
        """The hub's proof that its tree of ``from_size`` is a prefix of that of ``to_size``
        (RFC 9162 §2.1.4.1), unchecked. Raises ``NotFound`` for a size beyond the log,
        ``BadRequest`` for ``from_size > to_size``."""
        query = frames.ProofQuery(workspace=self.name, from_size=from_size, to_size=to_size)
        return _proof_reply(await self.session.request(query))

    async def inclusion_proof(self, seq: int, tree_size: int) -> list[bytes]:
        """The hub's audit path of event ``seq`` in its tree of ``tree_size`` (RFC 9162
        §2.1.3.1), unchecked. Raises ``NotFound``, ``BadRequest``."""
        query = frames.ProofQuery(workspace=self.name, seq=seq, tree_size=tree_size)
        return _proof_reply(await self.session.request(query))

    async def verify_inclusion(self, event: Event) -> SignedCheckpoint:
        """Check that ``event`` (as received: stored fields and all) is in the log: it is
        leaf ``seq - 1`` of the tree of the latest checkpoint, itself checked as by
        :meth:`checkpoint`. Returns that checkpoint. Raises
        :class:`~hub.core.errors.TamperDetected` when the proof does not lead to the signed
        root, ``BadRequest`` on a session without ``verify`` or for an event of no seq."""
        if self.session.verifier is None:
            raise BadRequest("verify_inclusion needs a session opened with verify=True")
        if event.seq < 1 or event.workspace not in ("", self.name):
            raise BadRequest(f"not a stored event of {self.name!r}", field="seq")
        signed = await self.checkpoint()
        if signed.size < event.seq:
            raise NotFound(
                f"seq {event.seq} is beyond the latest checkpoint (size {signed.size})",
                seq=event.seq,
            )
        proof = await self.inclusion_proof(event.seq, signed.size)
        leaf = leaf_hash(canonical_bytes(event))
        try:
            check_inclusion(event.seq - 1, signed.size, leaf, proof, signed.root)
        except ProofError as e:
            raise TamperDetected(
                f"event {event.seq} of {self.name!r} is not in the tree the hub signed at size "
                f"{signed.size}: {e.message}",
                workspace=self.name,
                previous=signed.note,
                current=signed.note,
                seq=event.seq,
            ) from e
        return signed

    async def cosign(self, cosigned: str, witness_key: str) -> SignedCheckpoint:
        """Hand the hub a checkpoint cosigned by a witness (the whole note, the witness's
        signature added) with the witness's verifier key; the hub keeps the cosignature and
        serves it with the checkpoint from then on. Needs the write right. Returns the
        checkpoint with its cosignatures as the hub now keeps them (unchecked)."""
        frame = frames.Cosign(workspace=self.name, cosignature=cosigned, key=witness_key)
        reply = _checkpoint_reply(await self.session.request(frame))
        try:
            parsed = parse_checkpoint(parse_note(reply.note).text)
        except NoteError as e:
            raise Internal(f"the hub sent a checkpoint that does not parse: {e}") from e
        return SignedCheckpoint(self.name, parsed, reply.note, reply.cosignatures)

    # -- reading ---------------------------------------------------------------------------

    def subscribe(self, after_seq: int | None = None) -> Subscription:
        """Every event with ``seq > after_seq`` in order, then live ones; ``after_seq`` None =
        live only. Raises :class:`~hub.core.errors.BadRequest` for a negative ``after_seq``; while
        iterating, ``Forbidden`` without the read right.

        The session follows the workspace from then on (one wire subscription, shared by every
        subscriber and waiter) until it closes or :meth:`leave` is called."""
        return Subscription(self, after_seq)

    def leave(self) -> None:
        """Stop following the workspace (unsubscribe); its subscriptions stop."""
        feed = self.session._feeds.get(self.name)
        if feed is not None:
            feed.leave()

    async def state(
        self,
        at_seq: int | None = None,
        *,
        contents: bool = False,
        paths: Sequence[str] | None = None,
    ) -> WorkspaceState:
        """The workspace state (files, work items, executions, artifacts, members), now or at
        ``at_seq``. Files carry metadata only unless ``contents`` (inline text/base64, bounded
        by the hub's ``max_state_contents_bytes``); ``paths``: only these files. Raises
        ``Forbidden`` (no read right), ``BadRequest``, ``TooLarge`` (contents over the cap)."""
        frame = frames.GetState(
            workspace=self.name,
            at_seq=at_seq,
            contents=contents,
            paths=None if paths is None else list(paths),
        )
        reply = await self.session.request(frame)
        if not isinstance(reply, frames.StateFrame):
            raise Internal(f"unexpected reply to state: {type(reply).__name__}")
        try:
            state: WorkspaceState = msgspec.convert(reply.state, WorkspaceState)
        except msgspec.ValidationError as e:
            raise Internal(f"the hub sent a state this client cannot read: {e}") from e
        return state

    async def head(self) -> int:
        """The seq of the workspace's last event (0 when empty). Raises ``Forbidden``."""
        async with self.subscribe(None) as sub:
            return await sub.head()

    async def events(self, after_seq: int = 0) -> list[Event]:
        """The whole history (every event with ``seq > after_seq`` up to the current head)."""
        out: list[Event] = []
        async with self.subscribe(after_seq) as sub:
            head = await sub.head()
            if head <= after_seq:
                return out
            async for ev in sub:
                out.append(ev)
                if ev.seq >= head:
                    return out
        raise SessionClosed("the session closed while reading the history")

    # -- files -----------------------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        base_rev: int | None = None,
        *,
        media_type: str | None = None,
        progress: Progress | None = None,
    ) -> FileWritten:
        """Write ``path`` (text as UTF-8, bytes as base64; content over the blob threshold
        is uploaded as a blob first and the event references it). ``base_rev``: the rev this
        write replaces (0: the file must not exist; None: no check). Raises ``Conflict``
        (stale ``base_rev``, ``details['rev']``), ``BadRequest`` (bad path), ``TooLarge``."""
        raw = content.encode() if isinstance(content, str) else content
        if len(raw) > INLINE_LIMIT:
            if isinstance(content, str) and media_type is None:
                media_type = TEXT_MEDIA_TYPE  # so read_file gives text back
            sha, _ = await blob_io.upload(self.session, self.name, raw, progress=progress)
            payload = FileWrittenPayload(
                path=path, blob=sha, base_rev=base_rev, media_type=media_type
            )
            return await self._emit(FileWritten(payload=payload))
        if isinstance(content, str):
            payload = FileWrittenPayload(
                path=path, text=content, base_rev=base_rev, media_type=media_type
            )
        else:
            payload = FileWrittenPayload(
                path=path,
                base64=base64.b64encode(content).decode("ascii"),
                base_rev=base_rev,
                media_type=media_type,
            )
        return await self._emit(FileWritten(payload=payload))

    async def read_file(self, path: str, *, progress: Progress | None = None) -> str | bytes:
        """The current content of ``path`` from the state: ``str`` if it was written as text,
        else ``bytes``; content in the blob store is downloaded (``getBlob``), text when its
        media type is ``text/*``. Raises ``NotFound`` (no such file)."""
        entry = (await self.state(contents=True, paths=[path])).files.get(path)
        if entry is None:
            raise NotFound(f"no file {path!r} in workspace {self.name!r}", path=path)
        if entry.text is not None:
            return entry.text
        if entry.base64 is not None:
            return base64.b64decode(entry.base64)
        if entry.blob is None:
            raise Internal(f"{path!r} has no content in the state")
        data = await self.get_blob(entry.blob, progress=progress)
        assert isinstance(data, bytes)
        if (entry.media_type or "").startswith("text/"):
            return data.decode("utf-8", errors="replace")
        return data

    # -- blobs (docs/protocol.md, "Blobs") -------------------------------------------------

    async def put_blob(self, source: BlobSource, *, progress: Progress | None = None) -> str:
        """Store ``source`` (bytes, a path, or an async byte stream) in the hub's blob store
        and return its sha256; an interrupted upload of the same content resumes. Raises
        ``TooLarge`` (``max_blob_bytes``, the workspace's quota), ``Forbidden``."""
        sha, _ = await blob_io.upload(self.session, self.name, source, progress=progress)
        return sha

    async def get_blob(
        self, sha256: str, dest: str | Path | None = None, *, progress: Progress | None = None
    ) -> bytes | Path:
        """A blob this workspace references (a file's content, an artifact): its bytes, or
        written to ``dest`` (returned). Raises ``NotFound``, ``IntegrityError``."""
        return await blob_io.download(self.session, self.name, sha256, dest, progress=progress)

    def open_blob(
        self, sha256: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """The bytes of a referenced blob as an async stream, from ``offset`` (``length`` of
        them, or to its end). Raises ``NotFound`` when iterated."""
        return blob_io.stream(self.session, self.name, sha256, offset=offset, length=length)

    async def publish_artifact(
        self,
        key: str,
        source: BlobSource,
        media_type: str = "application/octet-stream",
        *,
        progress: Progress | None = None,
    ) -> ArtifactPublished:
        """Upload ``source`` (bytes, a path or an async byte stream) and publish it as the
        artifact ``key``; the hub fills ``sha256`` and ``sizeBytes`` from the stored blob."""
        sha = await self.put_blob(source, progress=progress)
        payload = ArtifactPayload(key=key, media_type=media_type, blob=sha)
        return await self._emit(ArtifactPublished(payload=payload))

    async def delete_file(self, path: str, base_rev: int | None = None) -> FileDeleted:
        """Delete ``path``. Raises ``NotFound`` (no such file), ``Conflict`` (stale
        ``base_rev``)."""
        return await self._emit(
            FileDeleted(payload=FileDeletedPayload(path=path, base_rev=base_rev))
        )

    async def move_file(self, src: str, dst: str, base_rev: int | None = None) -> FileMoved:
        """Move ``src`` to ``dst``. Raises ``NotFound`` (no ``src``), ``Conflict`` (``dst``
        exists, stale ``base_rev``)."""
        return await self._emit(
            FileMoved(payload=FileMovedPayload(from_=src, to=dst, base_rev=base_rev))
        )

    async def post_message(self, text: str | None = None, data: Any = None) -> MessagePosted:
        """Post a conversation message."""
        return await self._emit(MessagePosted(payload=MessagePayload(text=text, data=data)))

    # -- work items (adk-code's verbs) -----------------------------------------------------

    def _note(self, ev: Event, *, complete: bool) -> None:
        """Remember a work item's topic (to default it in later verbs) and, when ``complete``
        (``ev`` is certainly the item's first event), its seq (waiters start there)."""
        cid = ev.correlation_id
        if cid is None or ev.kind not in COLLABORATION_KINDS:
            return
        known = self._items.get(cid)
        if known is not None and (known[1] or not complete) and (known[0] or not ev.topic):
            return
        topic = known[0] if known is not None and known[0] else ev.topic
        first = known[1] if known is not None and known[1] else (ev.seq if complete else 0)
        self._items[cid] = (topic, first)
        if len(self._items) > INDEX_SIZE:
            self._items.popitem(last=False)

    def _topic(self, correlation_id: str, topic: str | None) -> str | None:
        if topic is not None:
            return topic
        known = self._items.get(correlation_id)
        return known[0] if known is not None else None

    async def _work(
        self,
        cls: type[E],
        correlation_id: str,
        payload: Any,
        *,
        topic: str | None,
        consumer: str | None = None,
        causation_id: str | None = None,
    ) -> E:
        draft = cls(
            correlation_id=correlation_id,
            topic=self._topic(correlation_id, topic),
            consumer=consumer,
            causation_id=causation_id,
            payload=payload,  # type: ignore[call-arg]
        )
        return await self._emit(draft)

    async def request_work(
        self, topic: str, payload: Any = None, consumer: str | None = None
    ) -> NeedWork:
        """Open a work item (``needWork``) under a new correlationId; returns the stored event
        (``.correlation_id``, ``.seq``)."""
        draft = NeedWork(
            correlation_id=str(uuid.uuid4()), topic=topic, consumer=consumer, payload=payload
        )
        return await self._emit(draft, opens=True)

    async def claim_work(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> WorkClaimed:
        """Take ownership (``workClaimed``). Raises ``Conflict`` (claimed by another agent, or
        the item is completed/cancelled)."""
        return await self._work(
            WorkClaimed, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def publish_work(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> WorkPublished:
        """Announce a work product (``workPublished``). Raises ``Forbidden`` (not the owner),
        ``Conflict`` (item finished)."""
        return await self._work(
            WorkPublished,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def request_feedback(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> FeedbackRequested:
        """Ask for feedback (``feedbackRequested``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            FeedbackRequested,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def provide_feedback(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> FeedbackProvided:
        """Give feedback (``feedbackProvided``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            FeedbackProvided,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def signal_blocked(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> Blocked:
        """Say the item cannot progress (``blocked``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            Blocked, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def signal_completed(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> Completed:
        """Close the item (``completed``, terminal). Raises ``Forbidden`` (an owned item
        closed by a non-owner), ``Conflict`` (already finished)."""
        return await self._work(
            Completed, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def cancel_work(
        self, correlation_id: str, payload: Any = None, *, topic: str | None = None
    ) -> WorkCancelled:
        """Cancel the item (``workCancelled``, terminal). Raises ``Forbidden`` (neither the
        requester nor the owner), ``Conflict`` (already finished)."""
        return await self._work(WorkCancelled, correlation_id, payload, topic=topic)

    # -- waiters ---------------------------------------------------------------------------

    def _start(self, correlation_id: str | None, after_seq: int | None) -> int:
        """Where a waiter starts reading: ``after_seq``, else just before the item's first
        event if this handle knows it, else the beginning of the log."""
        if after_seq is not None:
            return after_seq
        if correlation_id is not None:
            known = self._items.get(correlation_id)
            if known is not None and known[1] > 0:
                return known[1] - 1
        return 0

    async def wait_for(
        self,
        correlation_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
        kinds: Iterable[str] | None = None,
        exclude_self: bool = False,
    ) -> Event:
        """The first event of work item ``correlation_id`` with ``seq > after_seq`` (of one of
        ``kinds`` if given; not produced by this agent if ``exclude_self``).

        Reads the log first, from ``after_seq`` (default: the item's first event, or the start
        of the log), then waits for live events, so an event published before the call is
        found. Raises ``TimeoutError`` after ``timeout`` seconds, ``SessionClosed``.
        """
        wanted = frozenset(kinds) if kinds is not None else None
        me = self.session.agent
        start = self._start(correlation_id, after_seq)
        async with asyncio.timeout(timeout), self.subscribe(start) as sub:
            async for ev in sub:
                if ev.correlation_id != correlation_id:
                    continue
                if wanted is not None and ev.kind not in wanted:
                    continue
                if exclude_self and ev.producer == me:
                    continue
                return ev
        raise SessionClosed("the session closed while waiting")

    async def wait_for_kind(
        self,
        correlation_id: str,
        kind: str | type[Event],
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
    ) -> Event:
        """The first event of ``kind`` (``"workPublished"`` or the class) in work item
        ``correlation_id`` with ``seq > after_seq``; see :meth:`wait_for`. Raises
        ``TimeoutError``."""
        name = kind if isinstance(kind, str) else kind.kind
        return await self.wait_for(correlation_id, timeout, after_seq=after_seq, kinds=(name,))

    async def wait_for_feedback(
        self,
        correlation_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
    ) -> FeedbackProvided:
        """The first ``feedbackProvided`` of the item after ``after_seq``. Raises
        ``TimeoutError``."""
        ev = await self.wait_for_kind(
            correlation_id, FeedbackProvided, timeout, after_seq=after_seq
        )
        assert isinstance(ev, FeedbackProvided)
        return ev

    async def wait_for_work(
        self,
        topic: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int = 0,
    ) -> NeedWork:
        """An open work request (``needWork``) on ``topic`` (any topic if None) addressed to
        this agent or to anyone, that nobody has claimed, completed or cancelled yet.

        Reads the log from ``after_seq`` to the head first and returns the oldest such request;
        otherwise the next one published. Raises ``TimeoutError``, ``SessionClosed``.
        """
        me = self.session.agent
        open_items: dict[str, NeedWork] = {}
        async with asyncio.timeout(timeout), self.subscribe(after_seq) as sub:
            head = await sub.head()
            caught_up = head <= after_seq
            async for ev in sub:
                cid = ev.correlation_id
                if isinstance(ev, NeedWork):
                    if (
                        cid is not None
                        and (topic is None or ev.topic == topic)
                        and (ev.consumer is None or ev.consumer == me)
                        and cid not in open_items
                    ):
                        open_items[cid] = ev
                elif cid is not None and ev.kind in _TAKEN:
                    open_items.pop(cid, None)
                if ev.seq >= head:
                    caught_up = True
                if caught_up and open_items:
                    return next(iter(open_items.values()))
        raise SessionClosed("the session closed while waiting")


def _checkpoint_reply(reply: frames.ServerFrame) -> frames.CheckpointFrame:
    if not isinstance(reply, frames.CheckpointFrame):
        raise Internal(f"unexpected reply to checkpoint: {type(reply).__name__}")
    return reply


def _proof_reply(reply: frames.ServerFrame) -> list[bytes]:
    if not isinstance(reply, frames.ProofFrame):
        raise Internal(f"unexpected reply to proof: {type(reply).__name__}")
    return list(reply.hashes)
