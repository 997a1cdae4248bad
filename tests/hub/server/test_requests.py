"""Requests over real sockets: publish (single, batch), idempotent retries, conflicts,
ownership, state, subscribe/unsubscribe on several workspaces."""

from __future__ import annotations

import uuid

from tests.support.hub import HubProcess, StartHub
from tests.support.peer import message, peer
from tests.support.tokens import mint


def work(kind: str, cid: str, **payload: object) -> dict[str, object]:
    return {"kind": kind, "correlationId": cid, "payload": payload or None}


async def test_single_publish_ack(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        ack = await p.publish("single", message(id="ev-1"))
        assert ack == {
            "op": "ack",
            "rid": ack["rid"],
            "workspace": "single",
            "seq": 1,
            "id": "ev-1",
            "duplicate": False,
        }
        minted = await p.publish("single", message())
        assert minted["seq"] == 2 and minted["id"] and minted["id"] != "ev-1"


async def test_idempotent_retry(hub: HubProcess) -> None:
    event_id = str(uuid.uuid4())
    async with peer(hub.url, mint()) as p:
        first = await p.publish("retry", message("once", id=event_id))
        await p.publish("retry", message("other"))
        head = await p.head("retry")
        again = await p.publish("retry", message("once", id=event_id))
        assert (again["seq"], again["id"], again["duplicate"]) == (first["seq"], event_id, True)
        assert await p.head("retry") == head
    # Also from another connection of another agent, and for batches.
    async with peer(hub.url, mint("bob")) as p:
        again = await p.publish("retry", message("once", id=event_id))
        assert again["seq"] == first["seq"] and again["duplicate"] is True
        batch = [message("a", id="b-1"), message("b", id="b-2")]
        ack = await p.call("publish", workspace="retry", events=batch)
        assert ack["seqs"] == [head + 1, head + 2] and ack["ids"] == ["b-1", "b-2"]
        assert ack["duplicate"] is False
        retry = await p.call("publish", workspace="retry", events=batch)
        assert retry["seqs"] == ack["seqs"] and retry["duplicate"] is True
        assert await p.head("retry") == head + 2


async def test_expected_seq_conflict(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        await p.publish("cas", message())
        await p.publish("cas", message())
        ok = await p.publish("cas", message(), expectedSeq=2)
        assert ok["seq"] == 3
        stale = await p.publish("cas", message(), expectedSeq=2)
        assert stale["op"] == "error" and stale["code"] == "conflict"
        assert stale["details"]["head"] == 3
        assert await p.head("cas") == 3


async def test_ownership_conflicts(hub: HubProcess) -> None:
    async with peer(hub.url, mint("alice")) as alice, peer(hub.url, mint("bob")) as bob:
        assert (await alice.publish("own", work("needWork", "task-1")))["op"] == "ack"
        assert (await alice.publish("own", work("workClaimed", "task-1")))["op"] == "ack"
        head = await alice.head("own")
        claim = await bob.publish("own", work("workClaimed", "task-1"))
        assert claim["code"] == "conflict", claim
        publish = await bob.publish("own", work("workPublished", "task-1"))
        assert publish["code"] == "forbidden", publish
        assert await bob.head("own") == head
        assert (await alice.publish("own", work("workPublished", "task-1")))["op"] == "ack"


async def test_base_rev_conflicts(hub: HubProcess) -> None:
    def write(text: str, base_rev: int | None) -> dict[str, object]:
        payload: dict[str, object] = {"path": "src/a.txt", "text": text}
        if base_rev is not None:
            payload["baseRev"] = base_rev
        return {"kind": "fileWritten", "payload": payload}

    async with peer(hub.url, mint()) as p:
        assert (await p.publish("files", write("v1", 0)))["op"] == "ack"
        again = await p.publish("files", write("v1 again", 0))
        assert again["code"] == "conflict" and again["details"]["rev"] == 1
        assert (await p.publish("files", write("v2", 1)))["op"] == "ack"
        stale = await p.publish("files", write("v3", 1))
        assert stale["code"] == "conflict" and stale["details"]["baseRev"] == 1
        state = await p.call("state", workspace="files")
        assert state["seq"] == 2
        assert state["state"]["files"]["src/a.txt"]["rev"] == 2
        assert "text" not in state["state"]["files"]["src/a.txt"]  # metadata unless asked
        state = await p.call("state", workspace="files", contents=True, paths=["src/a.txt"])
        assert state["state"]["files"]["src/a.txt"]["text"] == "v2"


async def test_state_contents_over_the_cap_are_too_large_and_paths_narrow_them(
    start_hub: StartHub,
) -> None:
    """The ``state`` reply is bounded (issue 11 item 3): metadata by default, and inline
    contents at most ``[limits] max_state_contents_bytes`` per reply (``tooLarge`` naming
    ``$.contents`` over it); asking for fewer ``paths`` gets them."""
    hub = start_hub("[limits]\nmax_state_contents_bytes = 1000\n")
    async with peer(hub.url, mint("big")) as p:
        for name in ("a.txt", "b.txt"):
            payload = {"path": name, "text": name[0] * 600}
            ack = await p.publish("cap", {"kind": "fileWritten", "payload": payload})
            assert ack["op"] == "ack", ack
        meta = await p.call("state", workspace="cap")
        assert all("text" not in f for f in meta["state"]["files"].values()), meta
        over = await p.call("state", workspace="cap", contents=True)
        assert (over["op"], over["code"]) == ("error", "tooLarge"), over
        assert over["details"]["field"] == "$.contents" and over["details"]["limit"] == 1000
        one = await p.call("state", workspace="cap", contents=True, paths=["a.txt"])
        assert one["state"]["files"]["a.txt"]["text"] == "a" * 600


async def test_state_now_and_at_seq(hub: HubProcess) -> None:
    async with peer(hub.url, mint("sam")) as p:
        for i in range(3):
            payload = {"path": f"f{i}.txt", "text": str(i)}
            await p.publish("st", {"kind": "fileWritten", "payload": payload})
        now = await p.call("state", workspace="st")
        assert now["op"] == "state" and now["workspace"] == "st" and now["seq"] == 3
        assert set(now["state"]) >= {"files", "workItems", "executions", "artifacts", "members"}
        assert sorted(now["state"]["files"]) == ["f0.txt", "f1.txt", "f2.txt"]
        past = await p.call("state", workspace="st", atSeq=1)
        assert past["seq"] == 1 and sorted(past["state"]["files"]) == ["f0.txt"]


async def test_subscribe_several_workspaces_and_unsubscribe(hub: HubProcess) -> None:
    async with peer(hub.url, mint("pub")) as pub, peer(hub.url, mint("sub")) as sub:
        for ws in ("multi-a", "multi-b"):
            await pub.publish(ws, message(f"{ws} old"))
        a = await sub.call("subscribe", workspace="multi-a", afterSeq=0)
        b = await sub.call("subscribe", workspace="multi-b")  # live only
        assert a == {"op": "subscribed", "rid": a["rid"], "workspace": "multi-a", "head": 1}
        assert b["op"] == "subscribed" and b["head"] == 1
        old = await sub.events("multi-a", 1)
        assert [e["payload"]["text"] for e in old] == ["multi-a old"]
        # Each subscription records the subscriber's presence.
        joined_a = await sub.events("multi-a", 2)
        joined_b = await sub.events("multi-b", 2)
        assert joined_a[-1]["kind"] == joined_b[-1]["kind"] == "memberJoined"
        assert (await sub.call("subscribe", workspace="multi-a"))["code"] == "exists"
        await pub.publish("multi-a", message("a live"))
        await pub.publish("multi-b", message("b live"))
        assert (await sub.events("multi-a", 3))[-1]["payload"]["text"] == "a live"
        assert (await sub.events("multi-b", 3))[-1]["payload"]["text"] == "b live"
        unsub = await sub.call("unsubscribe", workspace="multi-a")
        assert unsub == {"op": "unsubscribed", "rid": unsub["rid"], "workspace": "multi-a"}
        assert (await sub.call("unsubscribe", workspace="multi-a"))["code"] == "notFound"
        await pub.publish("multi-a", message("a unseen"))
        await pub.publish("multi-b", message("b seen"))
        seen = await sub.events("multi-b", 4)
        assert seen[-1]["payload"]["text"] == "b seen"
        assert not [f for f in sub.inbox if f.get("workspace") == "multi-a"]


async def test_subscribe_after_seq_beyond_head(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        reply = await p.call("subscribe", workspace="beyond", afterSeq=5)
        assert reply["code"] == "badRequest" and reply["details"]["field"] == "$.afterSeq"
        assert (await p.call("subscribe", workspace="beyond", afterSeq=0))["op"] == "subscribed"
