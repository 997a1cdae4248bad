"""The one way a writer stores a blob for an event it is about to append: intent → store →
append → drop the intent (:class:`BlobStaging`), and the sweep of what a crash left between
(:func:`sweep_intents`).

Every writer that stores a blob before the event referencing it is in the log goes through
a :class:`BlobStaging`: a publish's inline content over the blob threshold
(:meth:`hub.workspaces.Workspaces.publish`), a run's artifacts and a guest module an agent
sent whole (:mod:`hub.runtime`), the blobs ``agora import --blobs`` copies in
(:mod:`hub.commands.import_`). Each new blob is preceded by a durable
:class:`~hub.log.base.BlobIntent` naming its event and stored with the intent's stamp; a blob
stored already is only touched (someone else's event references it, or will: no intent). Once
the events are appended the intents are dropped; a write the hub refuses after all removes its
new blobs at once; a crash between storing and appending leaves the intents, and the sweep the
hub runs at start and every :data:`ORPHAN_GRACE_S` (hub.server.app) removes each blob whose
event never committed, unless it was stored or used again since. (Blobs a client uploads are
another matter: a grant, not an event, is what references them, and ``agora blobs gc`` drops
the unreferenced ones; docs/operations.md, "Blob sweep".)
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from hub.core.errors import AgoraError, ClientError
from hub.core.validation import blob_refs
from hub.log.base import BlobIntent, EventStore

__all__ = ["ORPHAN_GRACE_S", "BlobStaging", "sweep_intents"]

log = logging.getLogger(__name__)

# How old a blob intent is before a sweep takes it for a crash's: a write's blobs are stored
# and its append committed within moments, but another process (another hub node, an `agora
# append`) may have one in flight while this hub starts or sweeps. Also how often a running
# hub sweeps.
ORPHAN_GRACE_S: Final = 300.0

StagedSource = bytes | Path
"""What a staged blob was stored from: its content, or the file it was read from."""


class BlobStaging:
    """The blobs one write to ``workspace`` stores for the events it then appends.

    Use as ``async with BlobStaging(store, workspace) as staged:`` around storing
    (:meth:`put`, :meth:`put_file`) and appending. After the append, :meth:`committed` when
    the write knows its events are in the log; otherwise the exit settles each intent by
    looking its event up (:meth:`settle`) when the block ended normally or with a
    :class:`~hub.core.errors.ClientError` (refused: nothing of it, or only part of it, is in
    the log, and no append is in flight). Any other error (the store failed, cancelled, a
    crash) leaves the intents: whether the append committed is not known here, and the sweep
    finds out once they are past the grace.

    A blob one write references from several events (the same content twice, a run's
    artifact that is also a file it wrote back) is stored once, by the first, and has one
    intent per event: the write may append them in several batches, some refused, and the
    blob stays if any of them committed (:func:`sweep_intents` settles a blob's intents
    together).

    A write that appends in several batches (the runtime's record of a run) passes its
    staging to :meth:`hub.workspaces.Workspaces.publish` (``staged=``), which then stores
    the batch's inline content through it and leaves settling to the owner.
    """

    def __init__(self, store: EventStore, workspace: str) -> None:
        self.store = store
        self.workspace = workspace
        self.intents: list[BlobIntent] = []
        """The intents written for the blobs this write stored, not dropped yet."""
        self._sources: dict[str, StagedSource] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, ClientError):
            await self.settle()

    async def put(self, event_id: str, data: bytes, *, sha256: str | None = None) -> str:
        """Store ``data`` for event ``event_id`` (its intent first when it is new); return its
        sha256 (``sha256``: already computed by the caller). Raises what the blob store
        raises (``TooLarge``, ``Unavailable``)."""
        sha = sha256 if sha256 is not None else hashlib.sha256(data).hexdigest()
        stamp = await self._intend(event_id, sha, len(data), data)
        if stamp is not None:
            await self.store.blobs.put(data, stamp=stamp)
        return sha

    async def _intend(self, event_id: str, sha: str, size: int, source: StagedSource) -> int | None:
        """The intent before storing blob ``sha`` for ``event_id``: the stamp to store a new
        blob with, or ``None`` when it is not to be stored: stored by this write already
        (then one more intent, for this event, and no touch: a touch would hide the blob
        from the sweep), or by someone else (touched, so no sweep takes it from under this
        write; no intent)."""
        blobs = self.store.blobs
        if sha in self._sources:
            if not any(i.sha256 == sha and i.event_id == event_id for i in self.intents):
                self.intents.append(await blobs.intend(self.workspace, event_id, sha, size))
            return None
        if await blobs.touch(sha):
            return None
        intent = await blobs.intend(self.workspace, event_id, sha, size)
        self.intents.append(intent)
        self._sources[sha] = source
        return intent.stamp

    async def put_file(self, event_id: str, path: Path) -> tuple[str, int]:
        """Store the file at ``path`` for event ``event_id``, chunk by chunk, never whole in
        memory (:meth:`hub.log.base.BlobStore.put_file`): hashed first, then its intent when
        it is new, then stored with the intent's stamp. Returns (sha256, size). Raises
        ``OSError`` (not a regular file, gone) and what the blob store raises."""

        async def intend(sha: str, size: int) -> int | None:
            return await self._intend(event_id, sha, size, path)

        return await self.store.blobs.put_file(path, intend=intend)

    async def committed(self) -> None:
        """The write's events are in the log: drop the intents (a blob a sweep took while
        the write was stalled past the grace is stored again first). Never raises: an intent
        that cannot be dropped is left for the sweep, which finds its event."""
        intents, self.intents = self.intents, []
        kept: set[str] = set()
        for intent in intents:
            try:
                if intent.sha256 not in kept:
                    await _keep_if_swept(self.store, intent, self._sources.get(intent.sha256))
                    kept.add(intent.sha256)
                await self.store.blobs.settle(intent)
            except (AgoraError, OSError) as e:
                log.warning(
                    "the intent of blob %s in %s is left for the sweep: %s",
                    intent.sha256,
                    intent.workspace,
                    e,
                )

    async def settle(self) -> int:
        """Settle each intent by its event: committed, the intent is dropped (as by
        :meth:`committed`); not, its blob is removed unless used since, and the intent
        dropped. Returns how many blobs were removed. Call it only once no append of this
        write is in flight. Never raises (an intent that cannot be settled is kept)."""
        intents, self.intents = self.intents, []
        return await sweep_intents(self.store, intents, sources=self._sources)


async def sweep_intents(
    store: EventStore,
    intents: Sequence[BlobIntent],
    *,
    sources: dict[str, StagedSource] | None = None,
) -> int:
    """Settle ``intents``, those of one blob in one workspace together: when an event of
    theirs committed (found by id, as idempotency finds it, and referencing the blob) the
    intents are dropped; else the blob is removed unless it was stored or used again after
    the first of them (then another write, an upload or the hub references it), and the
    intents dropped. Returns how many blobs were removed. A blob stored for an event never had
    a grant, so no quota counted it; nothing else to undo. ``sources``: what a live write
    stored its blobs from, to store one again that a sweep took meanwhile although its event
    committed. Never raises: the intents of a blob that cannot be settled now (an unreadable
    workspace, a store hiccup) are kept for the next sweep, and must not stop the others nor
    mask the refusal a write is reporting."""
    by_blob: dict[tuple[str, str], list[BlobIntent]] = {}
    for intent in intents:
        by_blob.setdefault((intent.workspace, intent.sha256), []).append(intent)
    removed = 0
    for (workspace, sha), group in by_blob.items():
        first = min(group, key=lambda i: i.stamp)  # the one whose write stored the blob
        try:
            found = await store.lookup_ids(workspace, [i.event_id for i in group])
            if any(sha in blob_refs(e) for e in found.values()):
                if sources is not None:
                    await _keep_if_swept(store, first, sources.get(sha))
            elif await store.blobs.delete_untouched(sha, first.stamp):
                log.info(
                    "removed blob %s of %s's event %s, never committed",
                    sha,
                    workspace,
                    first.event_id,
                )
                removed += 1
            for intent in group:
                await store.blobs.settle(intent)
        except (AgoraError, OSError) as e:
            log.warning("the intents of blob %s in %s are kept: %s", sha, workspace, e)
    return removed


async def _keep_if_swept(
    store: EventStore, intent: BlobIntent, source: StagedSource | None
) -> None:
    """A write that took longer than the sweep's grace to commit (a stalled writer, a long
    store outage) may have had its blob swept as a crash's orphan in the meantime: its event
    is committed now, so the blob is stored again from what the write still holds. Checked
    only past half the grace, so a write pays nothing."""
    age_s = time.time() - intent.stamp / 1_000_000
    if age_s < ORPHAN_GRACE_S / 2 or await store.blobs.touch(intent.sha256):
        return
    log.warning(
        "blob %s of %s's event %s was swept while its write was stalled (%.0f s): stored again",
        intent.sha256,
        intent.workspace,
        intent.event_id,
        age_s,
    )
    if isinstance(source, bytes):
        await store.blobs.put(source)
    elif source is not None:
        sha, _ = await store.blobs.put_file(source)
        if sha != intent.sha256:
            log.warning("%s changed since it was stored: blob %s is lost", source, intent.sha256)
