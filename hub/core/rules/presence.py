"""The members a dead hub node left present, and the ``memberLeft`` that records them gone. Pure.

On a log shared by several nodes each node records presence for its own connections, with
its id in ``payload.node`` (:class:`hub.server.presence.Presence`). A node that dies (``kill
-9``) writes no ``memberLeft`` for the agents connected through it; the survivor that reaps
it (:mod:`hub.cluster.heartbeat`) writes them instead, through
:class:`hub.cluster.members.StrandedMembers`, with this module deciding who:

an agent is *stranded* by node ``N`` in a workspace when the workspace state shows it present
(its last presence event is a ``memberJoined``), it joined through ``N`` and has not left
through ``N`` since, and every other way it is present through is a node that is not alive.
A membership with no node (an A2A member, an event written before nodes were recorded) is
not the dead node's to close: such an agent stays present.

The ``memberLeft`` (reason ``interrupted``, the reason a restart's recovery uses, ``node`` =
the dead node) gets an id derived from (workspace, agent, dead node, the seq of the
``memberJoined`` through it), so two survivors whose claims overlapped write it once: the
second publish answers ``duplicate``.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from typing import Final

import msgspec

from hub.core.events import Event, MemberJoined, MemberLeft, MemberPayload

__all__ = ["INTERRUPTED_REASON", "Stranded", "departure_event_id", "departures", "stranded"]

INTERRUPTED_REASON: Final = "interrupted"
"""``memberLeft.payload.reason`` of a member whose hub went away without writing its leave
(a restart's recovery, a dead node's reaping)."""
_NAMESPACE: Final = uuid.UUID("0d6a5c1e-7f2b-5a4c-8e9d-3b1f2a6c4d5e")


class Stranded(msgspec.Struct, frozen=True, kw_only=True):
    """An agent present in ``workspace`` only through a node that died: ``joined_seq`` is
    the seq of its ``memberJoined`` through that node, ``via`` that event's door."""

    workspace: str
    agent: str
    joined_seq: int
    via: str


class _Member:
    """One agent's presence so far: present by the workspace fold's rule (the last presence
    event), and the nodes it joined through and has not left through (node -> (seq, via))."""

    __slots__ = ("nodes", "present")

    def __init__(self) -> None:
        self.present = False
        self.nodes: dict[str | None, tuple[int, str]] = {}


def stranded(
    workspace: str, events: Iterable[Event], node: str, alive: Collection[str]
) -> list[Stranded]:
    """The agents ``node``'s death strands in ``workspace``, given the workspace's presence
    events in seq order (others are ignored) and the ids of the nodes still alive. By agent."""
    members: dict[str, _Member] = {}
    for event in events:
        if not isinstance(event, MemberJoined | MemberLeft):
            continue
        p = event.payload
        member = members.setdefault(p.agent, _Member())
        if isinstance(event, MemberJoined):
            member.present = True
            # The first join through a node opens its presence there (a node writes one join
            # per presence, however many connections the agent has through it).
            member.nodes.setdefault(p.node, (event.seq, p.via))
        else:
            member.present = False  # as the workspace fold: any leave ends the presence
            if p.node is None:
                member.nodes.clear()  # a leave naming no node (a restart's recovery): all
            else:
                member.nodes.pop(p.node, None)
    out: list[Stranded] = []
    for agent, member in sorted(members.items()):
        through = member.nodes.get(node)
        if not member.present or through is None:
            continue
        if any(other is None or other in alive for other in member.nodes if other != node):
            continue  # still present through a live node (or through no node at all)
        out.append(
            Stranded(workspace=workspace, agent=agent, joined_seq=through[0], via=through[1])
        )
    return out


def departure_event_id(workspace: str, agent: str, node: str, joined_seq: int) -> str:
    """The id of the ``memberLeft`` that closes ``agent``'s presence through ``node`` opened
    at ``joined_seq`` (a UUIDv5)."""
    return str(uuid.uuid5(_NAMESPACE, f"{workspace}\x00{agent}\x00{node}\x00{joined_seq}"))


def departures(member: Stranded, node: str) -> list[Event]:
    """The draft recording ``member`` gone with its dead ``node`` (produce it as the agent)."""
    payload = MemberPayload(
        agent=member.agent, via=member.via, reason=INTERRUPTED_REASON, node=node
    )
    event_id = departure_event_id(member.workspace, member.agent, node, member.joined_seq)
    return [MemberLeft(id=event_id, payload=payload)]
