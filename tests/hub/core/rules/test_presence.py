"""hub/core/rules/presence.py: who a dead node leaves present, and the leave that records it."""

from __future__ import annotations

from hub.core.events import (
    Event,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePosted,
    encode_event,
)
from hub.core.rules.presence import (
    INTERRUPTED_REASON,
    Stranded,
    departure_event_id,
    departures,
    stranded,
)


def joined(seq: int, agent: str, node: str | None, via: str = "websocket") -> MemberJoined:
    return MemberJoined(seq=seq, payload=MemberPayload(agent=agent, via=via, node=node))


def left(seq: int, agent: str, node: str | None) -> MemberLeft:
    return MemberLeft(seq=seq, payload=MemberPayload(agent=agent, reason="closed", node=node))


def agents(events: list[Event], node: str = "a", alive: set[str] | None = None) -> list[str]:
    return [s.agent for s in stranded("w", events, node, alive or {"b"})]


def test_an_agent_present_only_through_the_dead_node_is_stranded() -> None:
    events: list[Event] = [joined(1, "ann", "a"), MessagePosted(seq=2), joined(3, "bob", "b")]
    assert stranded("w", events, "a", {"b"}) == [
        Stranded(workspace="w", agent="ann", joined_seq=1, via="websocket")
    ]


def test_an_agent_also_present_through_a_live_node_stays() -> None:
    assert agents([joined(1, "ann", "a"), joined(2, "ann", "b")]) == []
    # ... unless the live node's presence ended (the agent left through it).
    assert agents([joined(1, "ann", "a"), joined(2, "ann", "b"), left(3, "ann", "b")]) == []
    # (That leave made the agent absent in the workspace state: nothing left to close.)


def test_other_ways_in_that_are_dead_too_do_not_keep_an_agent() -> None:
    events: list[Event] = [joined(1, "ann", "a"), joined(2, "ann", "c")]
    assert agents(events, alive={"b"}) == ["ann"]  # c is dead (or unknown): ann is gone


def test_a_membership_with_no_node_is_not_the_dead_nodes_to_close() -> None:
    assert agents([joined(1, "ann", None, via="a2a"), joined(2, "ann", "a")]) == []
    assert agents([joined(1, "ann", None)]) == []


def test_a_leave_through_the_dead_node_or_a_recovery_ends_it() -> None:
    assert agents([joined(1, "ann", "a"), left(2, "ann", "a")]) == []
    assert agents([joined(1, "ann", "a"), left(2, "ann", None)]) == []
    # Back through the dead node later: the newer join is the presence to close.
    events: list[Event] = [joined(1, "ann", "a"), left(2, "ann", "a"), joined(5, "ann", "a")]
    assert [s.joined_seq for s in stranded("w", events, "a", set())] == [5]


def test_the_leave_is_interrupted_names_the_node_and_has_a_stable_id() -> None:
    member = Stranded(workspace="w", agent="ann", joined_seq=4, via="websocket")
    (event,) = departures(member, "a")
    assert isinstance(event, MemberLeft)
    assert event.payload == MemberPayload(agent="ann", reason=INTERRUPTED_REASON, node="a")
    assert event.id == departure_event_id("w", "ann", "a", 4) == departures(member, "a")[0].id
    others = {
        departure_event_id("w", "ann", "a", 5),
        departure_event_id("w", "ann", "b", 4),
        departure_event_id("w", "bob", "a", 4),
        departure_event_id("v", "ann", "a", 4),
    }
    assert event.id not in others and len(others) == 4
    assert b'"node":"a"' in encode_event(event)
