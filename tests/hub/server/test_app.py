"""hub.server.app, the composition root: the one configuration reaches every part it builds
(``[limits]`` every session, ``[cluster]`` the node id the runtime records); the process
lifecycle over real sockets: SIGTERM (close 1001, exit 0, pending appends finished), SIGKILL
(every acknowledged event survives, the chain verifies), and presence in the log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from hub.auth import TokenSigner
from hub.config import HubConfig
from hub.core.errors import ConfigError
from hub.core.events import MemberJoined, MemberLeft
from hub.log.factory import open_store
from hub.log.sqlite import SqliteEventStore
from hub.server.app import Hub
from hub.server.owner import container_owner
from hub.server.workers import WorkerRole
from tests.support.hub import HubProcess
from tests.support.peer import Peer, message, peer
from tests.support.tokens import SECRET, mint


async def test_the_configured_limits_reach_every_connection(
    start_hub: Callable[..., HubProcess],
) -> None:
    """``[limits]`` from agora.toml is what each session enforces (one type, not a copy)."""
    hub = start_hub("[limits]\nmax_subscriptions = 1\nmax_batch_events = 2\n")
    async with peer(hub.url, mint()) as p:
        assert (await p.call("subscribe", workspace="one"))["op"] == "subscribed"
        busy = await p.call("subscribe", workspace="two")
        assert (busy["op"], busy["code"], busy["details"]["limit"]) == ("error", "busy", 1)
        too_many = await p.call("publish", workspace="one", events=[message()] * 3)
        assert (too_many["op"], too_many["code"]) == ("error", "tooLarge")
        assert (await p.call("publish", workspace="one", events=[message()] * 2))["op"] == "ack"


def test_the_root_builds_its_parts_from_the_one_configuration(tmp_path: Path) -> None:
    config = HubConfig().with_overrides(data=tmp_path / "data", node_id="pinned-node")
    hub = Hub(config, SqliteEventStore(tmp_path / "agora.db"), TokenSigner(SECRET.encode()))
    assert hub.node_id == "pinned-node"
    unpinned = Hub(
        HubConfig().with_overrides(data=tmp_path / "data"),
        SqliteEventStore(tmp_path / "other.db"),
        TokenSigner(SECRET.encode()),
    )
    assert unpinned.node_id != "pinned-node" and unpinned.node_id


def test_owners_need_a_url_the_other_nodes_reach_and_no_workers(tmp_path: Path) -> None:
    """``[cluster] owners`` relays frames to a node's URL: a wildcard host is not one (then
    ``[cluster] url`` is required), and workers share one port (refused together)."""
    signer = TokenSigner(SECRET.encode())
    wildcard = HubConfig().with_overrides(data=tmp_path / "d", host="0.0.0.0", owners=True)
    with pytest.raises(ConfigError, match=r"\[cluster\] url"):
        Hub(wildcard, SqliteEventStore(tmp_path / "a.db"), signer)
    given = wildcard.with_overrides(url="ws://10.0.0.11:8765")
    assert Hub(given, SqliteEventStore(tmp_path / "b.db"), signer).placement is None
    role = WorkerRole(index=0, count=2, socket_dir=tmp_path / "w")
    local = HubConfig().with_overrides(data=tmp_path / "d", owners=True)
    with pytest.raises(ConfigError, match="--workers"):
        Hub(local, SqliteEventStore(tmp_path / "c.db"), signer, worker=role)


def test_container_owner_is_one_per_data_directory(tmp_path: Path) -> None:
    one = HubConfig().with_overrides(data=tmp_path / "one")
    again = HubConfig().with_overrides(data=tmp_path / "sub" / ".." / "one")
    other = HubConfig().with_overrides(data=tmp_path / "two")
    assert container_owner(one) == container_owner(again)
    assert container_owner(one) != container_owner(other)
    assert container_owner(one).startswith("agora-") and len(container_owner(one)) == 18


async def _publish_forever(
    p: Peer, workspace: str, acked: list[tuple[int, str]], reached: asyncio.Event, after: int
) -> None:
    """Publish single events (pipelined, 8 in flight) until the connection drops; record
    every ack as (seq, id); set ``reached`` after ``after`` acks."""
    in_flight: dict[int, str] = {}
    rid = 0
    try:
        while True:
            while len(in_flight) < 8:
                rid += 1
                event_id = str(uuid.uuid4())
                in_flight[rid] = event_id
                event = message(event_id, id=event_id)
                frame = {"op": "publish", "rid": rid, "workspace": workspace, "event": event}
                await p.ws.send(json.dumps(frame))
            reply = json.loads(await p.ws.recv())
            if reply["op"] == "ack":
                assert reply["id"] == in_flight.pop(reply["rid"])
                acked.append((reply["seq"], reply["id"]))
                if len(acked) >= after:
                    reached.set()
            else:
                assert reply["op"] == "error", reply
                in_flight.pop(reply["rid"], None)
    except (ConnectionClosed, OSError):
        return


async def _stored(data_dir: Path, workspace: str) -> dict[int, str]:
    """seq → id of every stored event; asserts the chain verifies."""
    async with open_store(None, data_dir) as store:
        report = await store.verify(workspace)
        assert report.ok, report
        return {ev.seq: ev.id async for ev in store.read(workspace)}


async def test_sigkill_loses_no_acknowledged_event(
    start_hub: Callable[..., HubProcess], tmp_path: Path
) -> None:
    data = tmp_path / "durable"
    hub = start_hub(data_dir=data)
    acked: dict[str, list[tuple[int, str]]] = {"dur-a": [], "dur-b": []}
    async with contextlib.AsyncExitStack() as stack:
        tasks = []
        reached = []
        for i, workspace in enumerate(["dur-a", "dur-b", "dur-a"]):
            p = await stack.enter_async_context(peer(hub.url, mint(f"w{i}")))
            reached.append(asyncio.Event())
            publish = _publish_forever(p, workspace, acked[workspace], reached[-1], 100)
            tasks.append(asyncio.create_task(publish))
        async with asyncio.timeout(30):
            for event in reached:
                await event.wait()
        hub.kill()  # SIGKILL, mid-stream
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
    assert hub.proc is not None and hub.proc.returncode == -signal.SIGKILL

    restarted = start_hub(data_dir=data)
    async with peer(restarted.url, mint()) as p:
        for workspace, acks in acked.items():
            head = await p.head(workspace)
            assert head >= max(seq for seq, _ in acks)
            await p.call("subscribe", workspace=workspace, afterSeq=0)
            events = {e["seq"]: e["id"] for e in await p.events(workspace, head, 30)}
            for seq, event_id in acks:
                assert events[seq] == event_id
    assert restarted.terminate() == 0
    for workspace, acks in acked.items():
        stored = await _stored(data, workspace)
        assert all(stored[seq] == event_id for seq, event_id in acks)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
async def test_sigterm_closes_clients_1001_finishes_appends_and_exits_0(
    start_hub: Callable[..., HubProcess], tmp_path: Path, signum: signal.Signals
) -> None:
    data = tmp_path / "graceful"
    hub = start_hub(data_dir=data)
    acked: list[tuple[int, str]] = []
    async with (
        peer(hub.url, mint("watcher")) as watcher,
        peer(hub.url, mint("writer")) as writer,
    ):
        assert (await watcher.call("subscribe", workspace="term"))["op"] == "subscribed"
        reached = asyncio.Event()
        publishing = asyncio.create_task(_publish_forever(writer, "term", acked, reached, 50))
        async with asyncio.timeout(30):
            await reached.wait()
        assert hub.proc is not None
        hub.proc.send_signal(signum)
        closed = await watcher.closed(30)
        async with asyncio.timeout(30):
            await publishing
        assert writer.ws.close_code == 1001
    assert closed.rcvd is not None and closed.rcvd.code == 1001
    assert await asyncio.to_thread(hub.proc.wait, 30) == 0
    # Every ack is durable, and the watcher's presence ended in the log before exit.
    stored = await _stored(data, "term")
    assert all(stored[seq] == event_id for seq, event_id in acked)
    async with open_store(None, data) as store:
        presence = [
            (ev.kind, ev.payload.agent, ev.payload.reason)
            async for ev in store.read("term")
            if isinstance(ev, MemberJoined | MemberLeft)
        ]
    assert presence == [("memberJoined", "watcher", None), ("memberLeft", "watcher", "shutdown")]


async def test_presence_per_agent_across_connections(hub: HubProcess) -> None:
    ws = "presence"

    def members(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
        return [
            (e["kind"], e["payload"]["agent"], e["producer"])
            for e in events
            if e["kind"] in ("memberJoined", "memberLeft")
        ]

    async with peer(hub.url, mint("auditor")) as auditor:
        await auditor.publish(ws, message("start"))
        async with peer(hub.url, mint("ann")) as one, peer(hub.url, mint("ann")) as two:
            await one.call("subscribe", workspace=ws)
            await two.call("subscribe", workspace=ws, afterSeq=0)
            await one.call("unsubscribe", workspace=ws)  # ann is still there through `two`
            await one.publish(ws, message("still here"))
            # memberJoined is written by a task of the hub (after the recovery index): wait.
            for _ in range(500):
                state = (await auditor.call("state", workspace=ws))["state"]
                if "ann" in state["members"]:
                    break
                await asyncio.sleep(0.02)
            assert state["members"]["ann"]["present"] is True
        # `two` disconnected: ann's last subscription ended.
        for _ in range(500):
            state = (await auditor.call("state", workspace=ws))["state"]
            if not state["members"]["ann"]["present"]:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("no memberLeft for ann")
        head = await auditor.head(ws)
        await auditor.call("subscribe", workspace=ws, afterSeq=0)
        log = await auditor.events(ws, head)
    assert members(log)[:2] == [("memberJoined", "ann", "ann"), ("memberLeft", "ann", "ann")]
    joined = next(e for e in log if e["kind"] == "memberJoined")
    # ``via`` defaults to "websocket", and the event model omits defaults on the wire.
    assert joined["payload"]["agent"] == "ann"
    assert joined["payload"].get("via", "websocket") == "websocket"
    left = next(e for e in log if e["kind"] == "memberLeft")
    assert left["payload"]["reason"] == "closed"


async def test_restart_after_sigkill_closes_the_presence_it_left_open(
    start_hub: Callable[..., HubProcess], tmp_path: Path
) -> None:
    data = tmp_path / "presence-crash"
    hub = start_hub(data_dir=data)
    async with peer(hub.url, mint("ann")) as ann:
        await ann.call("subscribe", workspace="crash")
        for _ in range(500):  # memberJoined is written right after the subscription
            state = (await ann.call("state", workspace="crash"))["state"]
            if state["members"].get("ann", {}).get("present"):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("no memberJoined for ann")
        hub.kill()  # no memberLeft can be written now
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            await ann.closed(within=10)

    restarted = start_hub(data_dir=data)
    async with peer(restarted.url, mint("auditor")) as auditor:
        state = (await auditor.call("state", workspace="crash"))["state"]
        assert state["members"]["ann"]["present"] is False
        head = await auditor.head("crash")
        await auditor.call("subscribe", workspace="crash", afterSeq=0)
        log = await auditor.events("crash", head)
    left = [e for e in log if e["kind"] == "memberLeft" and e["payload"]["agent"] == "ann"]
    assert len(left) == 1 and left[0]["payload"]["reason"] == "interrupted"
    assert left[0]["producer"] == "ann"
    assert restarted.terminate() == 0
