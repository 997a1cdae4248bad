"""Presence: ``memberJoined``/``memberLeft`` per (agent, workspace), across connections.

The connections (:mod:`hub.server.connection`) count their subscriptions in and out of the one
:class:`Presence` of the hub; the events are written by tasks of the hub's top-level group
(:class:`hub.server.tasks.OwnedTasks`). On a store this hub has to itself, :meth:`Presence.recover`
closes the presence a crashed predecessor left open; on a shared store the survivor that reaps a
dead node does it for that node's members (:class:`hub.cluster.members.StrandedMembers`), found
by the node id every event here records.

Reconnects do not churn the log: when an agent's last subscription to a workspace ends, its
``memberLeft`` is held for ``[server] presence_grace_s``; a subscription of that agent to that
workspace within the window cancels it, and no ``memberJoined`` is written either (the agent
never stopped being present, as far as the log can tell). A leave for ``shutdown`` is written at
once, and :meth:`Presence.flush` writes every held leave when the hub stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from hub.core.events import MemberJoined, MemberLeft, MemberPayload
from hub.core.rules.presence import INTERRUPTED_REASON
from hub.runtime.recovery_index import RecoveryIndex
from hub.server.tasks import OwnedTasks
from hub.workspaces import Workspaces

__all__ = ["Presence"]

log = logging.getLogger("agora.server")


class Presence:
    """``memberJoined``/``memberLeft``, per (agent, workspace) across connections.

    ``tasks``: the hub's top-level group, which runs the writes (shutdown waits for them).
    ``node``: this hub node's id, recorded in every event (``payload.node``): on a shared log
    the survivor that reaps a dead node finds by it who was present through that node only.

    An agent joins a workspace when its first subscription to it (on any connection) starts,
    and leaves when its last one ends (unsubscribe or disconnect). :meth:`enter` and
    :meth:`exit` never wait: the events are appended by tasks of the hub's TaskGroup, chained
    per (agent, workspace) so that they reach the log in the order of the transitions.
    """

    def __init__(
        self,
        workspaces: Workspaces,
        tasks: OwnedTasks,
        index: RecoveryIndex | None = None,
        *,
        grace_s: float,
        node: str | None = None,
    ) -> None:
        self._workspaces = workspaces
        self._node = node
        self._index = index
        self._tasks = tasks
        self._grace_s = grace_s
        self._count: dict[tuple[str, str], int] = {}
        self._tail: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Leaves held for a reconnect: (agent, workspace) -> the timer that writes it.
        self._held: dict[tuple[str, str], tuple[asyncio.TimerHandle, str]] = {}
        self.reconnects_absorbed = 0  # for tests and metrics: leaves a reconnect cancelled

    def count(self, agent: str, workspace: str) -> int:
        return self._count.get((agent, workspace), 0)

    def enter(self, agent: str, workspace: str) -> None:
        key = (agent, workspace)
        self._count[key] = self._count.get(key, 0) + 1
        if self._count[key] == 1:
            held = self._held.pop(key, None)
            if held is not None:  # back within the grace window: still present
                held[0].cancel()
                self.reconnects_absorbed += 1
                return
            self._record(key, joined=True)

    def exit(self, agent: str, workspace: str, reason: str) -> None:
        """``reason`` (for ``memberLeft``): unsubscribed, closed, tooSlow, unauthorized,
        shutdown."""
        key = (agent, workspace)
        left = self._count.get(key, 0) - 1
        if left > 0:
            self._count[key] = left
            return
        self._count.pop(key, None)
        if self._grace_s <= 0 or reason == "shutdown":
            self._record(key, joined=False, reason=reason)
            return
        loop = asyncio.get_running_loop()
        self._held[key] = (loop.call_later(self._grace_s, self._release, key), reason)

    def flush(self) -> None:
        """Write every held leave now (the hub is stopping: nobody will come back)."""
        for key in list(self._held):
            self._held[key][0].cancel()
            self._release(key)

    def _release(self, key: tuple[str, str]) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._record(key, joined=False, reason=held[1])

    def _record(self, key: tuple[str, str], *, joined: bool, reason: str | None = None) -> None:
        previous = self._tail.get(key)
        kind = "joined" if joined else "left"
        task = self._tasks.spawn(
            self._append(previous, key, joined=joined, reason=reason),
            name=f"agora-presence:{kind}:{key}",
        )
        if task is None:
            log.warning("presence not recorded (hub stopping): %s %s %s", key[0], kind, key[1])
            return
        self._tail[key] = task

        def forget(t: asyncio.Task[None]) -> None:
            if self._tail.get(key) is t:
                del self._tail[key]

        task.add_done_callback(forget)

    async def recover(self) -> int:
        """Record as gone every member a crash left present (``memberLeft`` with reason
        ``interrupted``), so an audit never shows an agent in a workspace after the hub that
        served it died. Only for a store this hub has to itself: on a shared store, members
        present may be connected to another node. Returns how many were closed."""
        closed = 0
        index = self._index
        if index is not None and index.complete:
            # The index names every member that may be present (see hub.runtime.recovery_index).
            names = sorted({w for w, _ in index.members})
        else:
            names = [head.workspace for head in await self._workspaces.store.heads()]
        failed: set[str] = set()
        for name in names:
            if name in self._workspaces.quarantined:
                failed.add(name)
                continue
            try:
                state = await self._workspaces.state(name)
            except Exception as e:  # a damaged workspace must not keep the hub from starting
                reason = self._workspaces.quarantined.get(name)  # unreadable: said where read
                if reason is None:
                    reason = f"presence recovery failed: {type(e).__name__}: {e}"[:500]
                    log.error("workspace %s quarantined: %s", name, reason)
                    self._workspaces.quarantine(name, reason)
                if index is not None:
                    index.quarantined[name] = reason
                failed.add(name)
                continue
            for agent, member in sorted(state.members.items()):
                if not member.present:
                    continue
                payload = MemberPayload(agent=agent, via=member.via, reason=INTERRUPTED_REASON)
                try:
                    await self._workspaces.publish(
                        name, [MemberLeft(payload=payload)], producer=agent, trusted=True
                    )
                    closed += 1
                except Exception:  # a damaged workspace must not keep the hub from starting
                    log.exception("could not close the presence of %s in %s", agent, name)
                    failed.add(name)
        if index is not None:
            index.members = {key for key in index.members if key[0] in failed}
            await index.save()
        if closed:
            log.info("recorded %d member(s) left present by the previous run", closed)
        return closed

    async def _append(
        self,
        previous: asyncio.Task[None] | None,
        key: tuple[str, str],
        *,
        joined: bool,
        reason: str | None,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        agent, workspace = key
        index = self._index
        event: MemberJoined | MemberLeft
        if joined and index is not None:
            try:  # before the event: the index says at least what the log says
                await index.opening(index.members, (workspace, agent))
            except Exception:
                log.exception("could not record %s in the recovery index", key)
        if joined:
            payload = MemberPayload(agent=agent, via="websocket", node=self._node)
            event = MemberJoined(payload=payload)
        else:
            payload = MemberPayload(agent=agent, via="websocket", reason=reason, node=self._node)
            event = MemberLeft(payload=payload)
        try:
            await self._workspaces.publish(workspace, [event], producer=agent, trusted=True)
        except Exception:
            log.exception("could not record %s of %s in %s", event.kind, agent, workspace)
            return
        if not joined and index is not None and key not in self._count:
            with contextlib.suppress(Exception):
                await index.closed(index.members, (workspace, agent))
