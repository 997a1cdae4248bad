"""The follower: events other hub nodes commit, delivered to this node's subscribers.

Every node appends to the shared log through its own :class:`hub.workspaces.Workspaces`, which
announces only that node's commits to its listeners (the fan-out). The store's NOTIFY
(``<workspace>:<head>`` after each commit, see :meth:`hub.log.base.EventStore.follow`) tells
:class:`NodeFollower` that a workspace moved; it then calls :meth:`Workspaces.catch_up`, which reads
the log after the node's committed head and feeds the events through the same committed path.
Hence subscribers on every node see the same sequence, with no gap and no duplicate.

Bounded and cheap:

* A hint for a workspace that is not open here is dropped (nobody here subscribes to it; it
  is read from the log when it opens), and so is a hint at or below the committed head (this
  node's own commit, already delivered).
* A notification that **carries its commit's events** (PostgreSQL's, when they fit) is
  folded as it is, without reading the log back; the log is read only for what the carried
  events leave out (a gap, a page that did not fit or decode). What is held meanwhile is
  bounded by ``max_carried`` bytes.
* Hints are **coalesced** per workspace: while one is waiting or being caught up, later ones
  only raise the target head, so a burst of commits costs one read, not one per commit. At most
  ``concurrency`` catch-ups run at once, never two for one workspace. The pending set is keyed
  by open workspaces, so it is bounded by what is open; ``max_pending`` is a last guard that
  turns an overflow into one re-check of every open workspace.
* After the LISTEN connection was lost (``resumed``), or after a failed read, every open
  workspace is re-checked from its committed head: missed hints lose nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

from hub.core.backoff import Backoff
from hub.core.errors import AgoraError
from hub.log.base import EventStore
from hub.workspaces import Workspaces

__all__ = ["NodeFollower"]

log = logging.getLogger("agora.cluster")

DEFAULT_CONCURRENCY: Final = 4
DEFAULT_MAX_PENDING: Final = 65536
DEFAULT_MAX_CARRIED: Final = 8 * 1024 * 1024
"""Bytes of carried events (hub.log.base.EventStore.follow) held for catch-ups not yet run."""
RETRY_BACKOFF: Final = Backoff(initial=0.05, maximum=5.0, give_up_after=None)
"""Between a worker's failed catch-ups (the store is down): retried until it is back."""

_ANY: Final = -1
"""A pending target meaning "whatever the log has" (a re-check, no announced head)."""


class NodeFollower:
    """Feeds the events other nodes append to ``store`` into ``workspaces``. Use :meth:`run`.

    ``notify`` and ``resumed`` are the callbacks of :meth:`EventStore.follow`; they only record
    and wake, never wait. Touched only from the event loop.
    """

    def __init__(
        self,
        store: EventStore,
        workspaces: Workspaces,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_carried: int = DEFAULT_MAX_CARRIED,
    ) -> None:
        if concurrency < 1 or max_pending < 1 or max_carried < 0:
            raise ValueError("concurrency and max_pending must be >= 1, max_carried >= 0")
        self.store = store
        self.workspaces = workspaces
        self.concurrency = concurrency
        self.max_pending = max_pending
        self._pending: dict[str, int] = {}  # workspace -> head to reach (_ANY: re-check)
        self._ready: deque[str] = deque()  # pending workspaces no worker has taken yet
        self._running: set[str] = set()
        self.max_carried = max_carried
        # workspace -> the events notifications carried since it was last caught up, and
        # their bytes in all (bounded: past max_carried, hints are read back instead).
        self._carried: dict[str, list[bytes]] = {}
        self._carried_bytes = 0
        self._wake = asyncio.Event()
        # For tests and metrics.
        self.hints = 0
        self.catch_ups = 0
        self.delivered = 0
        self.resumes = 0
        self.carried = 0  # catch-ups given carried events
        self.carried_events = 0  # events those catch-ups folded (read back or not)

    # -- callbacks of EventStore.follow -------------------------------------------------------

    def notify(self, workspace: str, seq: int, carried: bytes | None = None) -> None:
        """A commit moved ``workspace``'s head to ``seq`` (``carried``: its events, when the
        notification held them)."""
        self.hints += 1
        head = self.workspaces.open_head(workspace)
        if head is None or seq <= head:
            return  # not served here, or already folded (typically this node's own commit)
        if carried is not None and self._carried_bytes + len(carried) <= self.max_carried:
            self._carried.setdefault(workspace, []).append(carried)
            self._carried_bytes += len(carried)
        self._schedule(workspace, seq)

    def _take_carried(self, workspace: str) -> list[bytes]:
        carried = self._carried.pop(workspace, [])
        self._carried_bytes -= sum(len(c) for c in carried)
        return carried

    def resumed(self) -> None:
        """Following (re)started: hints may have been missed; re-check every open workspace."""
        self.resumes += 1
        self.recheck()

    def recheck(self) -> None:
        """Catch up every open workspace from its committed head."""
        for workspace in self.workspaces.open_workspaces():
            self._schedule(workspace, _ANY)

    def _schedule(self, workspace: str, seq: int) -> None:
        known = self._pending.get(workspace)
        if known is None:
            if len(self._pending) >= self.max_pending:
                # Cannot happen while pending ⊆ open workspaces; stay bounded regardless.
                log.warning("follower: %d workspaces pending; re-checking all", len(self._pending))
                self._pending.clear()
                self._ready.clear()
                self._carried.clear()
                self._carried_bytes = 0
                for name in self.workspaces.open_workspaces()[: self.max_pending]:
                    self._pending[name] = _ANY
                    if name not in self._running:
                        self._ready.append(name)
                self._wake.set()
                return
            self._pending[workspace] = seq
            if workspace not in self._running:
                self._ready.append(workspace)
                self._wake.set()
        elif known != _ANY:
            self._pending[workspace] = _ANY if seq == _ANY else max(known, seq)

    # -- the tasks ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the store and run the catch-up workers until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(
                self.store.follow(self.notify, resumed=self.resumed), name="agora-follow:listen"
            )
            for i in range(self.concurrency):
                tg.create_task(self._work(), name=f"agora-follow:worker-{i}")

    async def _work(self) -> None:
        failures = 0
        while True:
            while not self._ready:
                self._wake.clear()
                await self._wake.wait()
            workspace = self._ready.popleft()
            seq = self._pending.pop(workspace, None)
            carried = self._take_carried(workspace)
            if seq is None:
                continue  # dropped by an overflow re-check
            self._running.add(workspace)
            failed = False
            try:
                self.catch_ups += 1
                before = self.delivered
                self.delivered += await self.workspaces.catch_up(
                    workspace, None if seq == _ANY else seq, carried
                )
                if carried:
                    self.carried += 1
                    self.carried_events += self.delivered - before
            except AgoraError as e:  # the store is unavailable, or a damaged row
                failed = True
                log.warning("follower: catching up %s failed: %s", workspace, e.message)
            except Exception:  # a bug: keep following the other workspaces
                failed = True
                log.exception("follower: catching up %s failed", workspace)
            finally:
                self._running.discard(workspace)
            if failed:
                self._schedule(workspace, _ANY)
                await asyncio.sleep(RETRY_BACKOFF.delay(failures))
                failures += 1
                continue
            failures = 0
            if workspace in self._pending:
                self._ready.append(workspace)  # hinted again while it was being caught up
                self._wake.set()
