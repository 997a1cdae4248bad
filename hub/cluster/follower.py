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
    ) -> None:
        if concurrency < 1 or max_pending < 1:
            raise ValueError("concurrency and max_pending must be >= 1")
        self.store = store
        self.workspaces = workspaces
        self.concurrency = concurrency
        self.max_pending = max_pending
        self._pending: dict[str, int] = {}  # workspace -> head to reach (_ANY: re-check)
        self._ready: deque[str] = deque()  # pending workspaces no worker has taken yet
        self._running: set[str] = set()
        self._wake = asyncio.Event()
        # For tests and metrics.
        self.hints = 0
        self.catch_ups = 0
        self.delivered = 0
        self.resumes = 0

    # -- callbacks of EventStore.follow -------------------------------------------------------

    def notify(self, workspace: str, seq: int) -> None:
        """A commit moved ``workspace``'s head to ``seq``."""
        self.hints += 1
        head = self.workspaces.open_head(workspace)
        if head is None or seq <= head:
            return  # not served here, or already folded (typically this node's own commit)
        self._schedule(workspace, seq)

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
            if seq is None:
                continue  # dropped by an overflow re-check
            self._running.add(workspace)
            failed = False
            try:
                self.catch_ups += 1
                self.delivered += await self.workspaces.catch_up(
                    workspace, None if seq == _ANY else seq
                )
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
