"""Token revocation: the revoked tokens, kept from the hub's system workspace.

A revocation is a ``tokenRevoked`` event in the system workspace
(:data:`~hub.core.capability.SYSTEM_WORKSPACE`, ``_agora``), written by ``agora token revoke``
through the store like ``agora append`` (so it is in the audited, hash-chained log and reaches
every hub node sharing the store). No client may publish there: ``tokenRevoked`` is a hub
kind, and the workspace refuses every untrusted publish.

:class:`Revocations` is the running hub's view: :meth:`Revocations.load` reads the system
workspace once before the hub accepts connections, :meth:`Revocations.run` then follows it
with a :class:`~hub.follow.LogFollower` polling every :data:`POLL_INTERVAL_S` seconds while
idle, which is what brings in a revocation another process wrote (the CLI beside a SQLite hub,
or any node or CLI on PostgreSQL) within a second. The doors ask :meth:`Revocations.check`
(through :meth:`Revocations.verifier`) when a token is presented, and wait on
:meth:`Revocations.until_ended` to end a connection or stream when its token expires or is
revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from hub.core.backoff import Backoff
from hub.core.capability import SYSTEM_WORKSPACE, Capability, RevocationList
from hub.core.errors import BadRequest, Unauthorized
from hub.core.events import Event, TokenRevoked, TokenRevokedPayload
from hub.core.records import AppendResult
from hub.core.validation import validate_id
from hub.follow import FollowerClosed, LogFollower
from hub.log.base import EventStore
from hub.workspaces import Workspaces

__all__ = [
    "POLL_INTERVAL_S",
    "Revocations",
    "read_revocations",
    "revocation",
    "revoke",
    "revoked_error",
]

log = logging.getLogger("agora.revocations")

POLL_INTERVAL_S: Final = 0.5
"""How often a hub looks at the system workspace for revocations written by another process."""

READ_PAGE: Final = 1000
_RETRY: Final = Backoff(initial=0.1, maximum=5.0, give_up_after=None)


def revoked_error() -> Unauthorized:
    """The refusal of a revoked token (``unauthorized``, reason ``revoked``)."""
    return Unauthorized("token has been revoked", reason="revoked")


def _expired_error() -> Unauthorized:
    return Unauthorized("token has expired", reason="expired")


class Revocations:
    """The revoked tokens a running hub refuses. ``clock`` (epoch seconds) decides expiry in
    :meth:`until_ended`; ``poll_interval``: see the module docstring."""

    def __init__(
        self,
        workspaces: Workspaces,
        *,
        clock: Callable[[], float] = time.time,
        poll_interval: float = POLL_INTERVAL_S,
    ) -> None:
        self.workspaces = workspaces
        self._clock = clock
        self._list = RevocationList()
        self._records: list[TokenRevoked] = []
        self._seq = 0
        self._follower = LogFollower(workspaces, poll_interval=poll_interval)
        # Replaced (after being set) whenever revocations arrive: waiters see every change.
        self._changed = asyncio.Event()

    # -- queries --------------------------------------------------------------------------

    @property
    def records(self) -> list[TokenRevoked]:
        """Every ``tokenRevoked`` event applied so far, in log order."""
        return list(self._records)

    @property
    def seq(self) -> int:
        """The last seq of the system workspace applied."""
        return self._seq

    def is_revoked(self, capability: Capability) -> bool:
        """Whether the token ``capability`` came from has been revoked."""
        return self._list.revokes(capability)

    def check(self, capability: Capability) -> Capability:
        """``capability``, unless its token is revoked: then raise :class:`Unauthorized`
        (reason ``revoked``)."""
        if self._list.revokes(capability):
            raise revoked_error()
        return capability

    def verifier(self, verify: Callable[[str], Capability]) -> Callable[[str], Capability]:
        """``verify`` (e.g. :meth:`hub.auth.TokenSigner.verify`) that also refuses revoked
        tokens."""

        def checked(token: str) -> Capability:
            return self.check(verify(token))

        return checked

    def ended(self, capability: Capability) -> Unauthorized | None:
        """Why a session holding ``capability`` must end now (expired or revoked), or None."""
        if capability.expired(self._clock()):
            return _expired_error()
        if self._list.revokes(capability):
            return revoked_error()
        return None

    async def until_ended(self, capability: Capability) -> Unauthorized:
        """Wait until ``capability``'s token expires or is revoked; return the refusal to send.
        Cheap to have many waiting: one shared event, one timer each."""
        while True:
            error = self.ended(capability)
            if error is not None:
                return error
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, capability.expires_at - self._clock())):
                    await changed.wait()

    # -- keeping up ---------------------------------------------------------------------------

    async def load(self) -> int:
        """Read the system workspace from the store (what is new since the last load); returns
        how many revocations were applied. Raises what the store raises."""
        applied = 0
        store = self.workspaces.store
        while True:
            page = await store.read_batch(SYSTEM_WORKSPACE, after_seq=self._seq, limit=READ_PAGE)
            applied += self._apply(page)
            if len(page) < READ_PAGE:
                return applied

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the system workspace until ``stop`` is set (a store failure is logged and
        retried with back-off; it never ends the hub)."""
        self._follower.install()
        follow = asyncio.create_task(self._follow(), name="agora-revocations")
        try:
            await stop.wait()
        finally:
            await self._follower.aclose()
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow

    async def _follow(self) -> None:
        attempt = 0
        while True:
            try:
                events = self._follower.follow(SYSTEM_WORKSPACE, self._seq)
                async with contextlib.aclosing(events):
                    async for event in events:
                        self._apply([event])
                        attempt = 0
            except FollowerClosed:
                return
            except Exception:
                log.exception("reading revocations failed; retrying")
                await asyncio.sleep(_RETRY.delay(attempt))
                attempt += 1

    def _apply(self, events: list[Event]) -> int:
        applied = 0
        for event in events:
            if event.seq <= self._seq:
                continue
            self._seq = event.seq
            if isinstance(event, TokenRevoked):
                self._list.add(event.payload, at=event.timestamp // 1000)
                self._records.append(event)
                applied += 1
        if applied:
            log.info("%d token revocation(s) applied (system workspace seq %d)", applied, self._seq)
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return applied


def revocation(
    *,
    token_id: str | None = None,
    agent: str | None = None,
    before: int | None = None,
    reason: str | None = None,
) -> TokenRevokedPayload:
    """A validated ``tokenRevoked`` payload. Raises :class:`BadRequest` (``details['field']``)
    for neither ``token_id`` nor ``agent``, an invalid id, or ``before`` without ``agent``."""
    if token_id is None and agent is None:
        raise BadRequest("name a token id or an agent to revoke", field="tokenId")
    if token_id is not None:
        validate_id(token_id, "tokenId")
    if agent is not None:
        validate_id(agent, "agent")
    elif before is not None:
        raise BadRequest("before applies to an agent's tokens: name the agent", field="before")
    if before is not None and before < 0:
        raise BadRequest("before must be >= 0 (epoch seconds)", field="before")
    if reason is not None:
        validate_id(reason, "reason")
    return TokenRevokedPayload(token_id=token_id, agent=agent, before=before, reason=reason)


async def revoke(
    store: EventStore, payload: TokenRevokedPayload, *, producer: str = "cli"
) -> AppendResult:
    """Append ``tokenRevoked`` to the system workspace of ``store`` (the hub's write path,
    trusted). Raises what :meth:`hub.workspaces.Workspaces.publish` raises."""
    workspaces = Workspaces(store)
    try:
        return await workspaces.publish(
            SYSTEM_WORKSPACE, [TokenRevoked(payload=payload)], producer=producer, trusted=True
        )
    finally:
        await workspaces.aclose()


async def read_revocations(store: EventStore) -> list[TokenRevoked]:
    """Every ``tokenRevoked`` of the system workspace of ``store``, in log order."""
    out: list[TokenRevoked] = []
    after = 0
    while True:
        page = await store.read_batch(SYSTEM_WORKSPACE, after_seq=after, limit=READ_PAGE)
        out.extend(ev for ev in page if isinstance(ev, TokenRevoked))
        if len(page) < READ_PAGE:
            return out
        after = page[-1].seq
