"""Signed checkpoints of each workspace's Merkle tree: the key, producing them, proofs.

The I/O beside :mod:`hub.workspaces`: the pure formats are :mod:`hub.core.checkpoint` and
:mod:`hub.core.merkle`; the stored hashes and kept checkpoints are the store's
(:class:`hub.log.base.EventStore`). docs/audit.md explains what a checkpoint proves.

* **The key** (:func:`load_or_create_key`): ``<data dir>/checkpoint.key``, mode 0600, in the
  signed-note signer form ``PRIVATE+KEY+agora.<hub id>+<key ID>+<base64>``, created at first
  start. It is separate from the token secret: who can mint tokens cannot sign history, and a
  rotated token secret leaves every checkpoint valid.
* **Production** (:class:`Checkpointer`): a checkpoint once ``every_events`` events were
  appended since the last one, or ``every_ms`` after the first event not yet covered, and on
  demand. Before signing, the new tree is checked to extend the last checkpoint kept: the hub
  refuses to sign a history inconsistent with one it signed before (c2sp.org/tlog-checkpoint,
  "Signatures"), which is what a log rewritten behind its back would ask of it.
* **Proofs**: inclusion of an event in a kept checkpoint's tree, consistency between sizes.

The server (:mod:`hub.server.app`) runs :meth:`Checkpointer.run` in its TaskGroup, calls
:meth:`Checkpointer.appended` after each commit, and serves checkpoints, proofs and
cosignatures on the wire (:mod:`hub.server.checkpoint_ops`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, NamedTuple, Self

import msgspec

from hub.config import AuditConfig
from hub.core.chain import canonical_bytes
from hub.core.checkpoint import (
    Checkpoint,
    CheckpointRecord,
    NoteError,
    NoteSigner,
    NoteVerifier,
    Signature,
    add_signatures,
    format_note,
    generate_signer,
    key_name_for,
    origin_for,
    parse_checkpoint,
    parse_note,
    parse_signer_key,
    sign_checkpoint,
    verified_by,
)
from hub.core.errors import BadRequest, ConfigError, IntegrityError, NotFound
from hub.core.merkle import (
    EMPTY_ROOT,
    append_leaf,
    consistency_proof,
    consistency_proof_indexes,
    frontier_root,
    inclusion_proof,
    inclusion_proof_indexes,
    leaf_hash,
    stored_hash_index,
    tree_hash,
    tree_hash_indexes,
)
from hub.log.base import EventStore, TreeHead

KEY_FILE: Final = "checkpoint.key"
_KEY_MODE: Final = 0o600

log = logging.getLogger(__name__)


# -- the key ----------------------------------------------------------------------------------


def key_path(data_dir: Path) -> Path:
    return data_dir / KEY_FILE


def load_key(data_dir: Path) -> NoteSigner:
    """The hub's checkpoint key. Raises :class:`NotFound` when there is none yet,
    :class:`ConfigError` when the file is unreadable, not private or not a signer key."""
    path = key_path(data_dir)
    try:
        text = path.read_text("utf-8")
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError as e:
        raise NotFound(f"no checkpoint key {str(path)!r} (created at first start)") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the checkpoint key {path}: {e}", source=str(path)) from e
    if mode & 0o077:
        raise ConfigError(
            f"the checkpoint key {path} is readable by others (mode {mode:o}); chmod 600 it",
            source=str(path),
        )
    try:
        return parse_signer_key(text)
    except NoteError as e:
        raise ConfigError(f"{path}: {e.message}", source=str(path)) from e


def load_or_create_key(data_dir: Path, hub_id: str | None = None) -> NoteSigner:
    """The hub's checkpoint key, created (mode 0600, named ``agora.<hub id>``; a random hub
    id unless ``hub_id``) when the data directory has none. Two processes starting at once
    end up with the same key: the file is created exclusively. Raises as :func:`load_key`."""
    path = key_path(data_dir)
    if not path.exists():
        signer = generate_signer(key_name_for(hub_id or os.urandom(4).hex()))
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _KEY_MODE)
        except FileExistsError:
            pass  # another process won the race; use its key
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(signer.skey() + "\n")
                f.flush()
                os.fsync(f.fileno())
    return load_key(data_dir)


# -- proofs -----------------------------------------------------------------------------------


class InclusionProof(msgspec.Struct, frozen=True):
    """Event ``seq`` is leaf ``seq - 1`` of the tree of ``size``: ``hashes`` is its audit
    path (RFC 9162 §2.1.3.1), deepest first."""

    workspace: str
    seq: int
    size: int
    hashes: tuple[bytes, ...]


class ConsistencyProof(msgspec.Struct, frozen=True):
    """The tree of ``old`` is a prefix of the tree of ``new`` (RFC 9162 §2.1.4.1)."""

    workspace: str
    old: int
    new: int
    hashes: tuple[bytes, ...]


async def root_hash(store: EventStore, workspace: str, size: int) -> bytes:
    """The root of ``workspace``'s tree of ``size`` from the stored hashes."""
    return tree_hash(size, await store.read_hashes(workspace, tree_hash_indexes(size)))


async def prove_inclusion(store: EventStore, workspace: str, seq: int, size: int) -> InclusionProof:
    """Raises :class:`hub.core.merkle.ProofError` when seq is not in the tree of size."""
    index = seq - 1
    reader = await store.read_hashes(workspace, inclusion_proof_indexes(index, size))
    hashes = tuple(inclusion_proof(index, size, reader))
    return InclusionProof(workspace=workspace, seq=seq, size=size, hashes=hashes)


async def prove_consistency(
    store: EventStore, workspace: str, old: int, new: int
) -> ConsistencyProof:
    """Raises :class:`hub.core.merkle.ProofError` when ``old > new``."""
    reader = await store.read_hashes(workspace, consistency_proof_indexes(old, new))
    hashes = tuple(consistency_proof(old, new, reader))
    return ConsistencyProof(workspace=workspace, old=old, new=new, hashes=hashes)


# -- auditing a log against checkpoints -------------------------------------------------------


class Finding(msgspec.Struct, frozen=True):
    """What :func:`audit_log` found for one checkpoint: ``problem`` None when the log still
    holds the tree it signed; else why not, and ``first_seq``, the first seq that differs
    from what was signed, when it can be told (None otherwise)."""

    label: str
    size: int
    problem: str | None = None
    first_seq: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


_AUDIT_PAGE: Final = 5000


async def audit_log(
    store: EventStore, workspace: str, checkpoints: Sequence[tuple[str, Checkpoint]]
) -> list[Finding]:
    """Check that ``workspace``'s log still contains each signed tree (``(label,
    checkpoint)``), recomputing the tree from the events themselves (never from the stored
    hashes, which whoever edits the database can rewrite too). One pass over the log.

    The first differing seq comes from a smaller checkpoint that still matches (a lower
    bound) and from the stored leaf hashes when they still hold the signed tree (an edit
    that did not also rewrite them); one findings per checkpoint, in the order given."""
    targets = sorted({c.size for _, c in checkpoints})
    roots: dict[int, bytes] = {}
    leaves: list[bytes] = []
    frontier: tuple[bytes, ...] = ()
    pending = iter(targets)
    want = next(pending, None)
    while want is not None and want == 0:
        roots[0] = EMPTY_ROOT
        want = next(pending, None)
    # aclosing: the walk stops at the largest checkpoint, and the page read ahead is dropped.
    async with contextlib.aclosing(store.read(workspace, batch=_AUDIT_PAGE)) as events:
        async for event in events:
            if want is None:
                break
            leaf = leaf_hash(canonical_bytes(event))
            frontier, _ = append_leaf(frontier, len(leaves), leaf)
            leaves.append(leaf)
            while want is not None and want == len(leaves):
                roots[want] = frontier_root(frontier)
                want = next(pending, None)
    matched = sorted(
        size for size, root in roots.items() if _signed_root(checkpoints, size) == root
    )
    findings: list[Finding] = []
    for label, checkpoint in checkpoints:
        size = checkpoint.size
        root = roots.get(size)
        if root == checkpoint.root:
            findings.append(Finding(label=label, size=size))
            continue
        lower = max((m for m in matched if m < size), default=0)
        first = await _first_difference(store, workspace, checkpoint, leaves, lower)
        if root is None:
            problem = (
                f"the log has {len(leaves)} events but the checkpoint signed {size}: events "
                "were removed (truncated or dropped)"
            )
            if first is None and lower == len(leaves):
                first = len(leaves) + 1
        else:
            problem = "the log's tree of that size has another root: history was rewritten"
        if first is None and lower:
            problem += f" somewhere after seq {lower}"
        findings.append(Finding(label=label, size=size, problem=problem, first_seq=first))
    return findings


def _signed_root(checkpoints: Sequence[tuple[str, Checkpoint]], size: int) -> bytes | None:
    roots = {c.root for _, c in checkpoints if c.size == size}
    return roots.pop() if len(roots) == 1 else None


async def _first_difference(
    store: EventStore,
    workspace: str,
    checkpoint: Checkpoint,
    leaves: list[bytes],
    lower: int,
) -> int | None:
    """The first seq (> ``lower``) whose leaf differs from the signed tree's, read from the
    stored hashes when those still hold the signed tree; None when they do not."""
    size = checkpoint.size
    try:
        if await root_hash(store, workspace, size) != checkpoint.root:
            return None
    except IntegrityError:  # hashes missing: nothing to compare with
        return None
    for start in range(lower, size, _AUDIT_PAGE):
        indexes = [stored_hash_index(0, i) for i in range(start, min(start + _AUDIT_PAGE, size))]
        signed = (await store.read_hashes(workspace, indexes)).read_hashes(indexes)
        for offset, leaf in enumerate(signed):
            i = start + offset
            if i >= len(leaves) or leaves[i] != leaf:
                return i + 1
    return None


# -- producing checkpoints --------------------------------------------------------------------


def _kept_root(record: CheckpointRecord) -> bytes:
    """The root hash a kept checkpoint signed (empty if its note does not parse: then no
    tree matches it)."""
    try:
        return parse_checkpoint(parse_note(record.note).text).root
    except NoteError:
        return b""


class _Signed(NamedTuple):
    """A checkpoint this checkpointer signed or checked, and the lineage
    (:class:`hub.log.base.TreeHead`) of the store's tree it is on."""

    record: CheckpointRecord
    root: bytes
    lineage: int

    def extended_by(self, head: TreeHead) -> bool:
        """Whether ``head`` is this checkpoint's tree or an extension of it: same lineage
        (grown in memory from it), not smaller, and the same root at the same size."""
        if head.lineage != self.lineage or head.size < self.record.size:
            return False
        return head.size > self.record.size or head.root == self.root


class Checkpointer:
    """Signs and keeps checkpoints of a store's workspaces (see the module docstring).

    Use as ``async with Checkpointer(store, signer, config):``; the background task that
    produces due checkpoints runs while inside (``close`` is idempotent and stops it).
    Without entering, :meth:`on_demand`, :meth:`latest` and the proofs still work (the CLI).
    ``clock``: monotonic milliseconds (tests)."""

    def __init__(
        self,
        store: EventStore,
        signer: NoteSigner,
        config: AuditConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = config if config is not None else AuditConfig()
        self.store = store
        self.signer = signer
        self.every_events = config.checkpoint_every_events
        self.every_ms = config.checkpoint_every_ms
        self._clock = clock
        # workspace -> (head seq last heard of, when its first uncovered event was heard of)
        self._pending: dict[str, tuple[int, float]] = {}
        self._signed: dict[str, int] = {}  # workspace -> size of the last checkpoint kept
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        # workspace -> the last checkpoint signed or checked here, with the store's tree
        # lineage it is on (see on_demand)
        self._last: dict[str, _Signed] = {}

    @property
    def verifier(self) -> NoteVerifier:
        return self.signer.verifier

    def origin(self, workspace: str) -> str:
        return origin_for(self.signer.name, workspace)

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="agora-checkpoints")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Produce due checkpoints until ``stop`` is set (a task of the hub's TaskGroup)."""
        async with self:
            await stop.wait()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- the schedule -------------------------------------------------------------------------

    def appended(self, workspace: str, head: int) -> None:
        """Hear of a commit (``head``: the workspace's new last seq). Never blocks; called
        for every append, so it only wakes the task when the event count makes a checkpoint
        due (the task's own timer covers ``every_ms``)."""
        seen = self._pending.get(workspace)
        since = self._clock() * 1000 if seen is None else seen[1]
        self._pending[workspace] = (head, since)
        if head - self._signed.get(workspace, 0) >= self.every_events:
            self._wake.set()

    def _due(self, workspace: str, head: int, since: float, now_ms: float) -> bool:
        signed = self._signed.get(workspace, 0)
        if head <= signed:
            return False
        return head - signed >= self.every_events or now_ms - since >= self.every_ms

    def due(self) -> list[str]:
        """The workspaces whose checkpoint is due now."""
        now_ms = self._clock() * 1000
        pending = self._pending.items()
        return [w for w, (head, since) in pending if self._due(w, head, since, now_ms)]

    async def produce_due(self) -> list[CheckpointRecord]:
        """Sign every due checkpoint now; returns them. A workspace whose log the hub refuses
        to sign is logged and dropped until its next commit; one whose store failed is logged
        and retried ``every_ms`` later."""
        made: list[CheckpointRecord] = []
        for workspace in self.due():
            try:
                made.append(await self.on_demand(workspace))
            except (IntegrityError, NotFound) as e:
                log.error("checkpoint of %s refused: %s", workspace, e.message)
                self._pending.pop(workspace, None)
            except Exception:
                # The store failed (unavailable, a bug): the producer runs in the hub's
                # TaskGroup and must not bring the hub down; try again in every_ms.
                log.exception("checkpoint of %s failed; retrying later", workspace)
                seen = self._pending.get(workspace)
                if seen is not None:
                    self._pending[workspace] = (seen[0], self._clock() * 1000)
        return made

    def _next_deadline_s(self) -> float:
        """Seconds until the earliest pending workspace is due by time (at most every_ms)."""
        now_ms = self._clock() * 1000
        wait_ms = min(
            (since + self.every_ms - now_ms for _, since in self._pending.values()),
            default=self.every_ms,
        )
        return max(0.0, min(wait_ms, self.every_ms)) / 1000

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_deadline_s()):
                    await self._wake.wait()
            self._wake.clear()
            await self.produce_due()

    # -- checkpoints --------------------------------------------------------------------------

    async def latest(self, workspace: str) -> CheckpointRecord | None:
        """The largest checkpoint kept of ``workspace`` (with its cosignatures)."""
        return await self.store.load_checkpoint(workspace)

    async def on_demand(self, workspace: str) -> CheckpointRecord:
        """A checkpoint of the workspace's whole log now: signed and kept, or the one kept
        already for that size. Raises :class:`NotFound` for a workspace without events,
        :class:`IntegrityError` when the log no longer extends the last checkpoint kept
        (the hub does not sign a rewritten history).

        Two ways to the same answer. When the store knows the tree it last committed
        (:meth:`EventStore.tree_head`) and that tree grew in memory from the last one this
        checkpointer signed or checked (same lineage), it extends that one by construction:
        sign its root, with nothing read; likewise when nothing of the workspace was ever
        signed (one read: whether anything was). Otherwise (the first checkpoint after start, a
        tree the store reloaded: another process wrote, a rebuild, an eviction; PostgreSQL)
        the tree is read back and checked against the last checkpoint kept."""
        lock = self._locks.setdefault(workspace, asyncio.Lock())
        async with lock:
            known = self.store.tree_head(workspace)
            last = self._last.get(workspace)
            if known is not None and last is not None and last.extended_by(known):
                if known.size > last.record.size:
                    kept = await self._keep(workspace, known.size, known.root)
                else:  # the same one: as kept now, with the cosignatures added since
                    kept = await self.store.load_checkpoint(workspace, known.size) or last.record
                self._last[workspace] = _Signed(kept, known.root, known.lineage)
            elif (
                known is not None
                and last is None
                and await self.store.load_checkpoint(workspace) is None
            ):
                # Nothing of this workspace was ever signed (a workspace new since the start,
                # the common first checkpoint): there is no history to check its tree
                # against, and the store's tree in memory is the one its stored hashes make
                # (its writer wrote or read them), so it is signed with nothing read back.
                kept = await self._keep(workspace, known.size, known.root)
                self._last[workspace] = _Signed(kept, known.root, known.lineage)
            else:
                kept, root = await self._checked(workspace)
                if known is not None and known.size == kept.size and known.root == root:
                    # The store's tree in memory is the one just checked: later ones of
                    # its lineage extend it.
                    self._last[workspace] = _Signed(kept, root, known.lineage)
            size = kept.size
            self._signed[workspace] = max(size, self._signed.get(workspace, 0))
            pending = self._pending.get(workspace)
            if pending is not None and pending[0] <= size:
                del self._pending[workspace]
            return kept

    async def _checked(self, workspace: str) -> tuple[CheckpointRecord, bytes]:
        """The checkpoint of the whole log as read back from the store (its hashes built if
        missing), after checking it extends the last one kept; and its root."""
        size = await self.store.ensure_hashes(workspace)
        if size == 0:
            raise NotFound(f"workspace {workspace!r} has no events", workspace=workspace)
        kept = await self.store.load_checkpoint(workspace, size)
        if kept is not None:
            return kept, _kept_root(kept)
        root = await root_hash(self.store, workspace, size)
        await self._check_extends_last(workspace, size, root)
        return await self._keep(workspace, size, root), root

    async def _keep(self, workspace: str, size: int, root: bytes) -> CheckpointRecord:
        """Sign the tree of ``size`` with ``root`` and keep it (or the one another writer
        kept for that size first)."""
        note = sign_checkpoint(
            Checkpoint(origin=self.origin(workspace), size=size, root=root), self.signer
        )
        record = CheckpointRecord(workspace=workspace, size=size, note=note)
        if not await self.store.save_checkpoint(record):
            record = await self.store.load_checkpoint(workspace, size) or record
        return record

    async def inclusion_proof(
        self, workspace: str, seq: int, size: int | None = None
    ) -> InclusionProof:
        """The proof that event ``seq`` is in the tree of ``size`` (default: the latest
        checkpoint kept). Raises :class:`NotFound` without a checkpoint, or for a ``size``
        beyond the log; :class:`hub.core.merkle.ProofError` for a seq outside the tree."""
        size = await self._size(workspace, size)
        return await prove_inclusion(self.store, workspace, seq, size)

    async def consistency_proof(
        self, workspace: str, old: int, new: int | None = None
    ) -> ConsistencyProof:
        """The proof that the tree of ``old`` is a prefix of the tree of ``new`` (default:
        the latest checkpoint kept). Raises as :meth:`inclusion_proof`."""
        new = await self._size(workspace, new)
        return await prove_consistency(self.store, workspace, old, new)

    async def _size(self, workspace: str, size: int | None) -> int:
        if size is None:
            latest = await self.store.load_checkpoint(workspace)
            if latest is None:
                raise NotFound(f"no checkpoint of {workspace!r} yet", workspace=workspace)
            return latest.size
        if size > await self.store.ensure_hashes(workspace):
            raise NotFound(f"the log of {workspace!r} has no tree of size {size}", size=size)
        return size

    async def _check_extends_last(self, workspace: str, size: int, root: bytes) -> None:
        last = await self.store.load_checkpoint(workspace)
        if last is None:
            return
        try:
            signed = parse_checkpoint(parse_note(last.note).text)
        except NoteError as e:
            raise IntegrityError(
                f"the last checkpoint kept of {workspace!r} does not parse: {e.message}"
            ) from e
        if signed.size > size:
            raise IntegrityError(
                f"the log of {workspace!r} has {size} events but size {signed.size} was "
                "signed before: it was truncated; not signing",
                workspace=workspace,
                seq=size + 1,
            )
        if await root_hash(self.store, workspace, signed.size) != signed.root:
            raise IntegrityError(
                f"the log of {workspace!r} no longer contains the tree of size {signed.size} "
                "signed before; not signing",
                workspace=workspace,
            )

    async def add_cosignatures(
        self, workspace: str, cosigned: str, witnesses: tuple[NoteVerifier, ...] = ()
    ) -> CheckpointRecord:
        """Keep the witness signatures of ``cosigned`` (a kept checkpoint of ``workspace``
        with cosignatures added). Only signatures of ``witnesses`` are kept when any are
        given, and each must verify. Raises :class:`NoteError` for a note that is not one of
        ours, :class:`NotFound` when the checkpoint is not kept here."""
        note = parse_note(cosigned)
        checkpoint = parse_checkpoint(note.text)
        if checkpoint.origin != self.origin(workspace):
            raise NoteError(
                f"the checkpoint is of {checkpoint.origin!r}, not {self.origin(workspace)!r}",
                reason="origin",
            )
        kept = await self.store.load_checkpoint(workspace, checkpoint.size)
        if kept is None:
            raise NotFound(
                f"no checkpoint of {workspace!r} at size {checkpoint.size}",
                workspace=workspace,
                size=checkpoint.size,
            )
        ours = parse_note(kept.signed())
        if ours.text != note.text:
            raise NoteError("the cosigned text differs from the checkpoint kept", reason="format")
        new = [s for s in note.signatures if not self.verifier.matches(s)]
        if witnesses:
            accepted: list[Signature] = []
            for w in witnesses:
                if verified_by(note, w) is not None:
                    accepted.extend(s for s in new if w.matches(s))
            new = accepted
        if not new:
            raise BadRequest("no cosignature to add", field="note")
        merged = add_signatures(ours, new)
        base = parse_note(kept.note)
        keys = {(s.name, s.key_id) for s in base.signatures}
        extra = "".join(s.line() for s in merged.signatures if (s.name, s.key_id) not in keys)
        await self.store.set_cosignatures(workspace, checkpoint.size, extra)
        return CheckpointRecord(
            workspace=workspace, size=checkpoint.size, note=kept.note, cosignatures=extra
        )


def signed_text(record: CheckpointRecord) -> str:
    """The record's whole note, re-formatted (exactly what :func:`parse_note` reads)."""
    return format_note(parse_note(record.signed()))


__all__ = [
    "KEY_FILE",
    "Checkpointer",
    "ConsistencyProof",
    "Finding",
    "InclusionProof",
    "audit_log",
    "key_path",
    "load_key",
    "load_or_create_key",
    "prove_consistency",
    "prove_inclusion",
    "root_hash",
    "signed_text",
]
