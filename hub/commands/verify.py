"""``agora verify [WORKSPACE]``: audit one workspace's log, or every workspace's.

Per workspace, three checks, made in one pass over its log (each event read and decoded
once):

1. The log: seqs gapless from 1 and every hash linking to the previous one
   (:func:`hub.core.chain.verify_chain`, as :meth:`hub.log.base.EventStore.verify`). The
   first bad seq is named.
2. The caches: the state loaded the way the server loads it (newest snapshot plus the log
   after it) equals a rebuild from the first event (what :func:`hub.log.loading.load_state`
   and :func:`~hub.log.loading.rebuild_state` give). Skipped when the workspace has no
   usable snapshot (both would be the same rebuild) or when check 1 failed.
3. The blobs the log references are in the blob store and still hash to their names.

``--jobs N`` (default: the CPUs this process may use) splits the chain check of a long
workspace (:data:`PARALLEL_MIN` events or more) over N worker processes, each checking a range
of seqs against the stored hash of the event just before it, while this process folds the
states; the output is that of one process (``--jobs 1``), the first break included
(:func:`verify_in_ranges`).

Prints ``ok WORKSPACE N events`` per sound workspace and a total; a damaged workspace is named
on stderr with its first bad seq, and the exit code is 1.

``--checkpoint FILE…`` (with WORKSPACE) adds the check a hash chain cannot make: that the log
still contains the Merkle tree each signed checkpoint (``agora checkpoint``, a client, a
witness) covered. The tree is recomputed from the events, so a truncated log, a rewrite with
the whole chain re-hashed, a reorder or a dropped event all fail, naming the checkpoint file
and, where it can be told, the first differing seq. Each checkpoint must be signed by the
hub's key (``--key``, default the data directory's; an auditor pins the key they were given)
for this workspace, and cosigned by every ``--witness-key``. docs/audit.md walks through it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import msgspec

from hub.checkpoints import audit_log
from hub.commands._audit import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PAGE,
    add_store_args,
    add_workspace_arg,
    integer_at_least,
    progress,
    progress_enabled,
    require_head,
    warn,
    with_store,
)
from hub.commands.checkpoint import read_verifier, verifier_from_args
from hub.commands.common import config_from_args, fail
from hub.core.chain import GENESIS, ChainWalk
from hub.core.checkpoint import Checkpoint, NoteError, NoteVerifier, open_checkpoint, origin_for
from hub.core.errors import AgoraError, BadRequest, IntegrityError, NotFound
from hub.core.events import Event
from hub.core.projections.snapshots import SNAPSHOT_NAME, SNAPSHOT_VERSION, from_snapshot
from hub.core.projections.workspace import WorkspaceState, fold
from hub.core.records import Head, Snapshot
from hub.core.validation import REFERENCING_KINDS, blob_refs
from hub.log.base import EventStore
from hub.log.loading import fold_log

COMMAND = "verify"

# The fields of WorkspaceState compared (and named when they differ).
_STATE_FIELDS: Final = tuple(WorkspaceState.__struct_fields__)

PARALLEL_MIN: Final = 200_000
"""Below this many events a workspace is checked in this process whatever ``--jobs`` says: a
worker starts in ~0.4 s (:data:`WORKER_START`), in which this process checks about as many
events alone (measured: 10^5 and 2·10^5 events took longer with two processes than one)."""
WORKER_START: Final = 150_000
"""A worker process's start-up (a fresh interpreter and its imports, ~0.4 s), in events of
chain this process checks meanwhile: added to its share."""
_FOLD_COST: Final = 0.35
"""What folding both states from the stored bytes costs per event, as a share of checking
the chain (read, decode in full, re-encode, SHA-256), measured at 10^6 events: 1.2 against
2.6-2.9 µs of CPU, less the workers' start-up (~0.4 s each). Sets how much of the chain this
process checks itself."""
RANGE_MIN: Final = 50_000
"""The fewest events worth a worker process of their own (its start-up is ~0.4 s of CPU):
on a machine of many CPUs a log of 10^5 events gets a few workers, not one per CPU."""
RANGE_MAX: Final = 200_000
"""The most events one worker checks in one go: a long log is cut into more ranges than
workers, so that the workers share the machine with this process's folds evenly and an
interrupted verify waits for no more than one range."""


def usable_cpus() -> int:
    """The CPUs this process may run on (``--jobs``' default)."""
    return len(os.sched_getaffinity(0))


def jobs_number(text: str) -> int:
    """argparse type: a number of processes, >= 1."""
    return integer_at_least(text, 1)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="check hash chains, seqs and snapshots of one or every workspace",
        description=(
            "Check that each workspace's log is gapless and its hash chain intact, and that "
            "the snapshot-based state equals a rebuild from scratch. Exit 1 naming the first "
            "bad seq of each damaged workspace."
        ),
    )
    add_workspace_arg(parser, optional=True)
    parser.add_argument(
        "--checkpoint",
        action="extend",
        nargs="+",
        default=[],
        type=Path,
        metavar="FILE",
        help="signed checkpoints the log must still contain (repeatable; needs WORKSPACE)",
    )
    parser.add_argument(
        "--key",
        default=None,
        metavar="PUBKEY",
        help="the hub's verifier key, or a file holding it (default: the data directory's)",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        default=[],
        metavar="PUBKEY",
        help="require each checkpoint to be cosigned by this witness key (repeatable)",
    )
    parser.add_argument(
        "--jobs",
        type=jobs_number,
        default=None,
        metavar="N",
        help=(
            "processes checking the hash chain of a long workspace (default: the usable "
            f"CPUs; 1: this process only; workspaces under {PARALLEL_MIN:,} events always "
            "use one)"
        ),
    )
    # For tests: cut every workspace into ranges of N events (the parallel path on a short
    # log), reading pages of min(N, the usual page) events in either path.
    parser.add_argument("--range-events", type=jobs_number, default=None, help=argparse.SUPPRESS)
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    if args.checkpoint and args.workspace is None:
        return fail(COMMAND, "--checkpoint needs a WORKSPACE", EXIT_USAGE)

    async def body(store: EventStore) -> int:
        if args.workspace is not None:
            heads = [await require_head(store, args.workspace)]
        else:
            heads = await store.heads()
        config = config_from_args(args)  # read by with_store already: it cannot fail now
        jobs = usable_cpus() if args.jobs is None else args.jobs
        split = Split.of(args.range_events)
        async with RangeWorkers(config.storage.store, config.storage.data_dir, jobs) as workers:
            return await verify_heads(store, heads, workers, split)

    async def verify_heads(
        store: EventStore, heads: list[Head], workers: RangeWorkers, split: Split
    ) -> int:
        show = progress_enabled()
        damaged = 0
        total = 0
        for head in heads:
            checked, problem = await verify_workspace(
                store, head, show_progress=show, workers=workers, split=split
            )
            total += checked
            if problem is None:
                print(f"ok {head.workspace} {checked} events")
            else:
                damaged += 1
                fail(COMMAND, f"workspace {head.workspace}: {problem}")
        workspaces = f"{len(heads)} workspace{'s' if len(heads) != 1 else ''}"
        unheld = await verify_checkpoints(store, args) if args.checkpoint else 0
        if damaged or unheld:
            parts = [f"{damaged} of {workspaces} damaged"] if damaged else []
            if unheld:
                parts.append(f"{unheld} of {len(args.checkpoint)} checkpoints not held")
            print(f"FAILED: {', '.join(parts)} ({total} events checked)")
            return EXIT_FAILED
        print(f"ok: {workspaces}, {total} events verified")
        return EXIT_OK

    return await with_store(COMMAND, args, body)


class Split(msgspec.Struct, frozen=True):
    """How a workspace's log is read and shared out: ``page`` events per store read (both
    paths) and, for a test, ``range_events`` (this process's share and every worker range
    that many events, whatever the log's length)."""

    page: int = PAGE
    range_events: int | None = None

    @classmethod
    def of(cls, range_events: int | None) -> Split:
        if range_events is None:
            return cls()
        page = min(PAGE, range_events)
        return cls(page=page, range_events=math.ceil(range_events / page) * page)

    def plan(self, head_seq: int, jobs: int, *, folds: bool) -> tuple[int, list[tuple[int, int]]]:
        """(the seq this process checks the chain up to, the seq ranges ``(after, until]``
        after it for the workers) for a log of ``head_seq`` events and ``jobs`` processes, this
        one included; no ranges when splitting does not pay. This process checks the first
        share while the workers start, then (when there is a snapshot) ``folds`` the rest of
        the log, so its share is what leaves it as busy as each worker. Every boundary is a
        whole number of pages: a range starts where the one-process walk starts a page."""
        if jobs < 2 or (self.range_events is None and head_seq < PARALLEL_MIN):
            return head_seq, []
        if self.range_events is not None:
            first = size = self.range_events
        else:
            workers = max(1, min(jobs - 1, head_seq // RANGE_MIN))
            # Busy alike, in events of chain checked: this process's first + rest·fold_cost
            # against each worker's start + rest / workers, with rest = head - first.
            fold_cost = _FOLD_COST if folds else 0.0
            first = int(
                max(0.0, head_seq * (1 / workers - fold_cost) + WORKER_START)
                / (1 - fold_cost + 1 / workers)
            )
            first = first // self.page * self.page
            count = max(workers, math.ceil((head_seq - first) / RANGE_MAX))
            size = math.ceil((head_seq - first) / count / self.page) * self.page
        if first >= head_seq:
            return head_seq, []
        return first, [(lo, min(lo + size, head_seq)) for lo in range(first, head_seq, size)]


async def verify_workspace(
    store: EventStore,
    head: Head,
    *,
    show_progress: bool = False,
    workers: RangeWorkers | None = None,
    split: Split = Split(),  # noqa: B008 (frozen)
) -> tuple[int, str | None]:
    """(events checked, the first problem or None) for one workspace, up to ``head``.

    One pass over the log does every check that needs its events: each page is decoded once
    (:meth:`EventStore.pages`, reading the next page meanwhile) and goes through the chain
    check, the rebuild from scratch and the state from the snapshot (both folds only when
    there is a usable snapshot to compare), and the collection of referenced blobs, which are
    then checked (:func:`verify_blobs`). A page is folded only once its chain checked out.

    With ``workers`` of more than one job and a long log, that pass stops at a first share of
    the log and the rest of the chain is checked in ranges by the workers
    (:func:`verify_in_ranges`). The answer is the same.
    """
    workspace = head.workspace
    snapshot = await store.load_snapshot(
        workspace, SNAPSHOT_NAME, SNAPSHOT_VERSION, at_or_before=head.seq
    )
    cached = None if snapshot is None else from_snapshot(snapshot, workspace)
    jobs = 1 if workers is None else workers.jobs
    first, ranges = split.plan(head.seq, jobs, folds=cached is not None)
    sound = _Sound(head, snapshot, cached, split.page)
    async with progress(f"verify {workspace}: {head.seq:,} events", enabled=show_progress):
        if workers is None or not ranges:
            return await sound.walk(store)
        return await verify_in_ranges(store, sound, workers, first, ranges)


class _Sound:
    """One workspace's checks as one process makes them: the walk over the log (chain,
    both folds, blob references) and what follows a sound chain (checks 2 and 3)."""

    def __init__(
        self, head: Head, snapshot: Snapshot | None, cached: WorkspaceState | None, page: int
    ) -> None:
        self.head = head
        self.snapshot = snapshot
        self.cached = cached
        self.rebuilt = None if cached is None else WorkspaceState(workspace=head.workspace)
        self.page = page
        self.refs: dict[str, int] = {}
        self.chain = ChainWalk()

    async def walk(self, store: EventStore) -> tuple[int, str | None]:
        """Walk the whole log from the first event; the answer."""
        answer = await self.walk_to(store, None)
        assert answer is not None  # only a walk with somewhere to stop stops early
        return answer

    async def walk_to(
        self, store: EventStore, stop_at: int | None
    ) -> tuple[int, str | None] | None:
        """Walk the log from the first event; the answer, or, with ``stop_at``, None once a
        page reaching that seq checked out (the log sound up to it: :attr:`chain`)."""
        walk, rebuilt, cached, refs = self.chain, self.rebuilt, self.cached, self.refs
        try:
            async with contextlib.aclosing(
                store.pages(self.head.workspace, until_seq=self.head.seq, batch=self.page)
            ) as pages:
                async for events in pages:
                    if walk.check(events) is not None:
                        break
                    if rebuilt is not None and cached is not None:
                        fold(rebuilt, events)
                        if events and events[-1].seq > cached.seq:  # the log after the snapshot
                            after = cached.seq
                            fold(cached, events if events[0].seq > after else _after(events, after))
                    _collect_blobs(refs, events)
                    if stop_at is not None and events and events[-1].seq >= stop_at:
                        return None
        except IntegrityError as e:  # a stored event that does not even decode
            return 0, e.message
        if walk.error is not None:
            return walk.checked, f"seq {walk.error.seq}: {walk.error.problem}"
        return walk.checked, await self.finish(store, walk.head)

    async def finish(self, store: EventStore, last_seq: int) -> str | None:
        """Checks 2 and 3 once the chain checked out up to ``last_seq``, with both states
        folded up to there: the state from the snapshot against the rebuild, then the
        referenced blobs."""
        workspace, snapshot, cached = self.head.workspace, self.snapshot, self.cached
        if snapshot is not None and cached is None:
            # load_state ignores it, so every reader still gets the right state; only speed
            # suffers.
            warn(COMMAND, f"workspace {workspace}: snapshot at seq {snapshot.seq} is unusable")
        if snapshot is not None and cached is not None and cached != self.rebuilt:
            fields = ", ".join(
                f for f in _STATE_FIELDS if getattr(cached, f) != getattr(self.rebuilt, f)
            )
            return (
                f"seq {last_seq}: the state from the snapshot at seq {snapshot.seq} "
                f"differs from a rebuild from scratch ({fields}); snapshots are disposable "
                "caches, deleting them repairs this"
            )
        return await verify_blobs(store, self.refs)

    async def fold_rest(self, store: EventStore) -> None:
        """Fold both states on to the head (from the stored bytes: hub.log.loading)."""
        if self.rebuilt is not None and self.cached is not None:
            await fold_log(store, self.rebuilt, until_seq=self.head.seq)
            await fold_log(store, self.cached, until_seq=self.head.seq)


async def verify_in_ranges(
    store: EventStore,
    sound: _Sound,
    workers: RangeWorkers,
    first: int,
    ranges: list[tuple[int, int]],
) -> tuple[int, str | None]:
    """:func:`verify_workspace` with the chain after seq ``first`` checked by ``workers``, one
    task per range of seqs (``ranges``: ``(after, until]``, consecutive from ``first``, each
    but the last a whole number of pages). Meanwhile this process walks the log up to
    ``first`` as one process would, then folds both states on from there.

    The answer is the one-process walk's. When every range checked out, ran up to its end
    and starts from the hash the range before it ended on, the log is sound up to the head,
    as that walk would find it. Otherwise let range *k* be the first one that did not (a
    break, an event that does not decode, a worker that failed, ranges that do not join):
    the log is sound up to its start, where the one-process walk also starts a page; this
    process walks the chain on from there and finds the same first problem that walk finds
    (or, should it find none, as when the log changed meanwhile, verifies it all again in
    one process).
    """
    head, page = sound.head, sound.page
    checks = [workers.check(head.workspace, after, until, page) for after, until in ranges]
    folding: asyncio.Future[None] | None = None
    try:
        if first > 0:
            answer = await sound.walk_to(store, first)
            if answer is not None:  # a problem, or a log that ended before ``first``
                return answer
            if sound.chain.head != first:  # cannot be (pages line up): one process decides
                return await _Sound(head, sound.snapshot, _reloaded(sound), page).walk(store)
        folding = asyncio.ensure_future(sound.fold_rest(store))
        prev = sound.chain.prev
        for (after, until), check in zip(ranges, checks, strict=True):
            try:
                outcome: RangeOutcome | None = await check
            except Exception:  # a worker that died: its range is walked here
                outcome = None
            if (
                outcome is None
                or outcome.problem is not None
                or outcome.prev != prev
                or outcome.checked != until - after
            ):
                folding.cancel()  # not needed after a problem, and it would slow the walk
                found = await _walk_chain_from(store, head, after, prev, page)
                if found is not None:
                    return found
                return await _Sound(head, sound.snapshot, _reloaded(sound), page).walk(store)
            prev = outcome.last_hash
            for sha, seq in outcome.refs.items():
                sound.refs.setdefault(sha, seq)  # ranges in seq order: the first seq naming it
        try:
            await folding
        except Exception:  # what the one pass would raise (or say), it raises (or says)
            return await _Sound(head, sound.snapshot, _reloaded(sound), page).walk(store)
        return head.seq, await sound.finish(store, head.seq)
    finally:
        # Not needed after a problem: cancelled (a range already running in a worker
        # finishes there, unheard), and waited for, so no task outlives this call.
        pending = [f for f in (*checks, folding) if f is not None and not f.done()]
        for future in pending:
            future.cancel()
        if pending:
            await asyncio.wait(pending)
        for ended in (*checks, folding):
            if ended is not None and ended.done() and not ended.cancelled():
                ended.exception()  # retrieved: a failure after a problem is nobody's


def _reloaded(sound: _Sound) -> WorkspaceState | None:
    """The state from the snapshot again (the walk folded into the first one)."""
    snapshot = sound.snapshot
    return None if snapshot is None else from_snapshot(snapshot, sound.head.workspace)


async def _walk_chain_from(
    store: EventStore, head: Head, after_seq: int, prev: str, page: int
) -> tuple[int, str] | None:
    """The one-process walk's answer for a log sound up to ``after_seq`` (whose event there
    has hash ``prev``), if it finds a problem after it; None if it finds none."""
    walk = ChainWalk(after_seq=after_seq, prev=prev)
    try:
        async with contextlib.aclosing(
            store.pages(head.workspace, after_seq=after_seq, until_seq=head.seq, batch=page)
        ) as pages:
            async for events in pages:
                if walk.check(events) is not None:
                    break
    except IntegrityError as e:
        return 0, e.message
    if walk.error is None:
        return None
    return after_seq + walk.checked, f"seq {walk.error.seq}: {walk.error.problem}"


# -- the worker processes ---------------------------------------------------------------------


class RangeTask(msgspec.Struct, frozen=True):
    """One range of a workspace's chain for a worker: the seqs ``(after_seq, until_seq]``,
    read in pages of ``page`` from the store at ``store_url``/``data_dir``."""

    store_url: str | None
    data_dir: str
    workspace: str
    after_seq: int
    until_seq: int
    page: int


class RangeOutcome(msgspec.Struct, frozen=True):
    """What a worker found in its range: ``prev``, the stored hash of the event at
    ``after_seq`` it checked the range against; ``checked`` events that check out; the first
    ``problem`` (a break, an event that does not decode, a store error) or None;
    ``last_hash`` of the last event checked; ``refs`` the blobs referenced (sha256 → the first
    seq naming it)."""

    prev: str
    checked: int = 0
    problem: str | None = None
    last_hash: str = GENESIS
    refs: dict[str, int] = {}


def check_range(task: RangeTask) -> RangeOutcome:
    """A worker's job (in its own process): check one range. Never raises: a failure is the
    outcome's ``problem`` (the parent then walks the range itself)."""
    try:
        return asyncio.run(_check_range(task))
    except Exception as e:  # crossing a process boundary: as text
        return RangeOutcome(prev=GENESIS, problem=f"worker failed: {e!r}")


async def _check_range(task: RangeTask) -> RangeOutcome:
    # Imported here: the store pulls in its drivers, which the other commands never need.
    from hub.log.factory import open_store

    workspace, after = task.workspace, task.after_seq
    async with open_store(task.store_url, Path(task.data_dir), read_only=True) as store:
        try:
            prev = GENESIS
            if after > 0:
                before = await store.read_batch(
                    workspace, after_seq=after - 1, until_seq=after, limit=1
                )
                if not before:
                    return RangeOutcome(prev=GENESIS, problem=f"no event at seq {after}")
                prev = before[0].hash or GENESIS
            walk = ChainWalk(after_seq=after, prev=prev)
            refs: dict[str, int] = {}
            async with contextlib.aclosing(
                store.pages(workspace, after_seq=after, until_seq=task.until_seq, batch=task.page)
            ) as pages:
                async for events in pages:
                    if walk.check(events) is not None:
                        break
                    _collect_blobs(refs, events)
        except IntegrityError as e:
            return RangeOutcome(prev=GENESIS, problem=e.message)
        problem = None if walk.error is None else f"seq {walk.error.seq}: {walk.error.problem}"
        return RangeOutcome(
            prev=prev, checked=walk.checked, problem=problem, last_hash=walk.prev, refs=refs
        )


def _worker_started() -> None:
    # Ctrl-C reaches the whole process group: the parent alone handles it (and stops us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RangeWorkers:
    """``jobs - 1`` worker processes (this one is the other job) checking ranges of chains
    (:func:`check_range`), each
    opening the store read-only itself. Started on first use (``spawn``: a fresh interpreter,
    never a fork of this process and its threads), stopped on exit."""

    def __init__(self, store_url: str | None, data_dir: Path, jobs: int) -> None:
        self.store_url = store_url
        self.data_dir = data_dir
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def check(
        self, workspace: str, after_seq: int, until_seq: int, page: int
    ) -> asyncio.Future[RangeOutcome]:
        """The outcome of one range, checked by a worker."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.jobs - 1,  # this process is the other job
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started,
            )
        task = RangeTask(self.store_url, str(self.data_dir), workspace, after_seq, until_seq, page)
        return asyncio.get_running_loop().run_in_executor(self._pool, check_range, task)

    async def aclose(self) -> None:
        """Stop the workers (waiting, off the loop, for the ranges they are on). Idempotent."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.shield(asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True))


def _after(page: list[Event], seq: int) -> list[Event]:
    return [ev for ev in page if ev.seq > seq]


def _collect_blobs(refs: dict[str, int], page: list[Event]) -> None:
    """Add the blobs ``page`` references to ``refs`` (sha256 → the first seq naming it)."""
    kinds = REFERENCING_KINDS
    for ev in page:
        if type(ev) in kinds:
            for sha in blob_refs(ev):
                refs.setdefault(sha, ev.seq)


async def verify_blobs(store: EventStore, refs: dict[str, int]) -> str | None:
    """The first problem with the referenced blobs ``refs`` (sha256 → the first seq
    referencing it): missing, or content that no longer hashes to its name; or None. Checked
    in seq order, each blob read in ranges."""
    for sha, seq in sorted(refs.items(), key=lambda i: i[1]):
        try:
            await store.blobs.check(sha)
        except NotFound:
            return f"seq {seq}: references blob {sha}, which is not in the blob store"
        except IntegrityError:
            return f"seq {seq}: blob {sha} does not match its hash"
    return None


async def verify_checkpoints(store: EventStore, args: argparse.Namespace) -> int:
    """Check the ``--checkpoint`` files against the log; print one line each; return how
    many failed. A file that does not parse or verify counts as failed."""
    workspace: str = args.workspace
    try:
        verifier = verifier_from_args(args, args.key)
        witnesses = tuple(read_verifier(k) for k in args.witness_key)
    except AgoraError as e:
        raise BadRequest(f"cannot check checkpoints: {e.message}") from e
    failed = 0
    checkpoints: list[tuple[str, Checkpoint]] = []
    for path in args.checkpoint:
        label = str(path)
        try:
            checkpoints.append((label, _read_checkpoint(path, verifier, witnesses, workspace)))
        except (NoteError, OSError, UnicodeDecodeError) as e:
            failed += 1
            message = e.message if isinstance(e, AgoraError) else str(e)
            fail(COMMAND, f"checkpoint {label}: {message}")
    for finding in await audit_log(store, workspace, checkpoints):
        if finding.ok:
            print(
                f"ok checkpoint {finding.label}: {workspace} still holds the tree of size "
                f"{finding.size}"
            )
            continue
        failed += 1
        where = f"; first differing seq {finding.first_seq}" if finding.first_seq else ""
        fail(
            COMMAND,
            f"checkpoint {finding.label} (size {finding.size}): the log of {workspace} no "
            f"longer contains the tree it signed: {finding.problem}{where}",
        )
    return failed


def _read_checkpoint(
    path: Path, verifier: NoteVerifier, witnesses: tuple[NoteVerifier, ...], workspace: str
) -> Checkpoint:
    text = path.read_text("utf-8")
    checkpoint, _ = open_checkpoint(
        text, verifier, origin=origin_for(verifier.name, workspace), witnesses=witnesses
    )
    return checkpoint
