"""The recovery index and quarantine (hub/runtime/recovery_index.py, recovery.py): a start reads
only the workspaces the index names; a workspace whose recovery fails is quarantined — refused
with ``unavailable`` (``details.quarantined``) — while the hub starts and serves the others; an
old data directory without the index is scanned once and then indexed. Over real sockets
against ``agora serve``, with the data written through the store API."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hub.core.events import (
    ExecRequested,
    ExecRequestedPayload,
    MemberJoined,
    MemberPayload,
    MessagePayload,
    MessagePosted,
)
from hub.log.codec import READ_MAX_DEPTH
from hub.log.factory import open_store
from hub.runtime.recovery_index import INDEX_NAME, RecoveryIndex, load_quarantined
from tests.support.hub import HubProcess
from tests.support.peer import ExecPeer, exec_peer, of_exec, of_kind, open_peer
from tests.support.tokens import mint_exec


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


async def _old_data_dir(data: Path) -> None:
    """What a hub of today leaves after a crash: an open execution and a present member in
    ``good``; in ``bad`` an open execution and an event no reader can read back."""
    async with open_store(None, data) as store:
        for workspace in ("good", "bad"):
            await store.append(
                workspace,
                [
                    ExecRequested(
                        payload=ExecRequestedPayload(exec_id="open", backend="process"),
                        producer="alice",
                    )
                ],
            )
        await store.append(
            "good", [MemberJoined(payload=MemberPayload(agent="alice"), producer="alice")]
        )
        poison = MessagePosted(
            payload=MessagePayload(data=_deep(READ_MAX_DEPTH + 20)), producer="alice"
        )
        await store.append("bad", [poison])
        assert await store.load_snapshot("_agora", INDEX_NAME, 1) is None
    # Written by the hub before schema 2 (which did not bound nesting): flagged when opened
    # next, so readers check every page and the poison is found (hub/log/sqlite.py).
    with sqlite3.connect(data / "agora.db") as conn:
        conn.execute("PRAGMA user_version=1")
    conn.close()


def _agora(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args], capture_output=True, text=True, timeout=120
    )


async def test_a_workspace_whose_recovery_fails_is_quarantined_and_the_hub_serves_the_rest(
    tmp_path: Path, start_runtime_hub: Callable[..., HubProcess]
) -> None:
    data = tmp_path / "old"
    await _old_data_dir(data)
    hub = start_runtime_hub(data_dir=data)
    async with exec_peer(hub.url) as p:
        good = (await p.call("execResult", workspace="good", execId="open"))["result"]
        bad = await p.call("execResult", workspace="bad", execId="open")
        published = await p.publish("bad", {"kind": "messagePosted", "payload": {"text": "x"}})
        ran = await p.run(workspace="good", source="true")
        left = of_kind(await p.log("good"), "memberLeft")
    assert (good["status"], good["reason"]) == ("failed", "interrupted")
    assert ran["status"] == "completed"
    assert [e["payload"]["reason"] for e in left] == ["interrupted"]
    for refused in (bad, published):
        assert refused["op"] == "error" and refused["code"] == "unavailable", refused
        assert "IntegrityError" in refused["details"]["quarantined"]
    assert "quarantined" in hub.log()
    assert hub.terminate() == 0

    # The index now says what a start must look at: nothing open, ``bad`` quarantined (so
    # tried again at every start until it recovers).
    async with open_store(None, data) as store:
        index = RecoveryIndex(store)
        await index.open()
        assert index.complete and index.executions == set()
        assert index.members == set()
        assert set(index.quarantined) == {"bad"}
        assert set(await load_quarantined(store)) == {"bad"}
    listed = _agora("workspaces", "--data", str(data), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["workspace"]: row for row in json.loads(listed.stdout)}
    assert "IntegrityError" in rows["bad"]["quarantined"] and "quarantined" not in rows["good"]

    hub.restart()  # again: the hub starts, ``bad`` is still refused, ``good`` served
    async with exec_peer(hub.url) as p:
        again = await p.publish("bad", {"kind": "messagePosted", "payload": {"text": "x"}})
        fine = await p.publish("good", {"kind": "messagePosted", "payload": {"text": "x"}})
    assert again["code"] == "unavailable" and fine["op"] == "ack", (again, fine)


async def test_with_workers_every_worker_refuses_what_the_supervisor_quarantined(
    tmp_path: Path, start_runtime_hub: Callable[..., HubProcess]
) -> None:
    """``agora serve --workers 2``: the supervisor recovers once; what it quarantines is
    refused by each worker from that worker's first request on (with the reason, never
    ``internal``), without the worker reading that log again (the supervisor's is the only
    report of it), and ``agora workspaces`` lists it afterwards. (It was quarantined in the
    supervisor's process only: a worker's first ``execResult`` there answered ``internal``
    and the listing showed nothing.)"""
    data = tmp_path / "old"
    await _old_data_dir(data)
    hub = start_runtime_hub(data_dir=data, args=("--workers", "2"))
    firsts: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    async with asyncio.timeout(30):
        while len(firsts) < 2:
            async with open_peer(ExecPeer, hub.url) as p:
                await p.send({"op": "hello", "rid": 0, "token": mint_exec()})
                server = (await p.recv())["server"]
                if server in firsts:
                    continue
                result = await p.call("execResult", workspace="bad", execId="open")
                published = await p.publish("bad", {"kind": "messagePosted", "payload": {}})
                firsts[server] = (result, published)
                ran = await p.run(workspace="good", source="true")
                assert ran["status"] == "completed"
    for refused in (r for pair in firsts.values() for r in pair):
        assert refused["op"] == "error" and refused["code"] == "unavailable", refused
        assert "IntegrityError" in refused["details"]["quarantined"]
    assert hub.log().count("workspace bad quarantined") == 1  # the supervisor's recovery
    assert hub.terminate() == 0
    listed = _agora("workspaces", "--data", str(data), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["workspace"]: row for row in json.loads(listed.stdout)}
    assert "IntegrityError" in rows["bad"]["quarantined"] and "quarantined" not in rows["good"]

    hub.restart()  # the next start (the index is stale: a full scan) quarantines it again
    async with exec_peer(hub.url) as p:
        again = await p.publish("bad", {"kind": "messagePosted", "payload": {"text": "x"}})
    assert again["code"] == "unavailable", again


FIRST_TOUCHES: list[tuple[str, dict[str, Any]]] = [
    ("exec", {"backend": "process", "source": "true"}),
    ("execResult", {"execId": "x"}),
    ("getExec", {"execId": "x"}),
    ("kill", {"execId": "x"}),
    ("dispose", {"execId": "x"}),
    ("state", {}),
    ("subscribe", {"afterSeq": 0}),
    ("publish", {"event": {"kind": "messagePosted", "payload": {}}}),
]


async def test_a_log_found_unreadable_by_any_request_is_refused_with_a_reason(
    tmp_path: Path, start_runtime_hub: Callable[..., HubProcess]
) -> None:
    """A start reads only the logs the index names, so a log nobody's recovery read may be
    found unreadable by the first request of any kind: each is answered ``unavailable`` with
    the reason (the execution requests, which read the log through the runtime's journal,
    answered ``internal``). A fresh start before each, so each request is the first read."""
    hub = start_runtime_hub()
    async with exec_peer(hub.url) as p:
        await p.run(source="true")  # the index exists, and will not name ``bad``
    assert hub.terminate() == 0
    async with open_store(None, hub.data_dir) as store:
        poison = MessagePosted(
            payload=MessagePayload(data=_deep(READ_MAX_DEPTH + 20)), producer="alice"
        )
        await store.append("bad", [poison])
    with sqlite3.connect(hub.data_dir / "agora.db") as conn:
        conn.execute("PRAGMA user_version=1")  # (see _old_data_dir)
    conn.close()
    for op, fields in FIRST_TOUCHES:
        hub.restart()
        async with exec_peer(hub.url) as p:
            reply = await p.call(op, workspace="bad", **fields)
        assert (reply["op"], reply["code"]) == ("error", "unavailable"), (op, reply)
        assert "IntegrityError" in reply["details"]["quarantined"], (op, reply)
        assert hub.terminate() == 0
    hub.restart()  # (the fixture stops it)


async def test_a_start_reads_only_what_the_index_names(
    tmp_path: Path, start_runtime_hub: Callable[..., HubProcess]
) -> None:
    """With the index in place, an open execution the index does not name is not looked for
    (the proof that the start did not fold that log); one it names is closed."""
    hub = start_runtime_hub()
    async with exec_peer(hub.url) as p:
        await p.run(source="true")  # the index exists (written at start, kept since)
    hub.kill()
    async with open_store(None, hub.data_dir) as store:
        for workspace in ("named", "unnamed"):
            await store.append(
                workspace,
                [
                    ExecRequested(
                        payload=ExecRequestedPayload(exec_id="x", backend="process"),
                        producer="alice",
                    )
                ],
            )
        index = RecoveryIndex(store)
        await index.open()
        assert index.complete
        await index.opening(index.executions, ("named", "x"))
    hub.restart()
    async with exec_peer(hub.url) as p:
        named = of_kind(of_exec(await p.log("named"), "x"), "execFinished")
        unnamed = of_kind(of_exec(await p.log("unnamed"), "x"), "execFinished")
    assert [e["payload"]["reason"] for e in named] == ["interrupted"]
    assert unnamed == []


async def test_journals_are_evicted_within_their_byte_bound_and_reloaded(tmp_path: Path) -> None:
    from hub.runtime.journal import Journals
    from hub.workspaces import Workspaces

    async with open_store(None, tmp_path / "data") as store:
        for i in range(20):
            drafts = [
                ExecRequested(
                    payload=ExecRequestedPayload(exec_id=f"e{j}", backend="process"),
                    producer="alice",
                )
                for j in range(10)
            ]
            await store.append(f"w{i}", drafts)
        workspaces = Workspaces(store)
        journals = Journals(workspaces, cache_bytes=30_000)
        for i in range(20):
            journal = await journals.get(f"w{i}")
            assert journal.record("e9") is not None
        kept = journals.loaded
        assert 0 < len(kept) < 20
        assert sum(j.approx_bytes() for j in kept) <= 30_000
        assert kept[-1].workspace == "w19"  # the most recently used stay
        again = await journals.get("w0")  # evicted: reloaded from the log on demand
        assert again.record("e0") is not None and again.seq == 10
        await asyncio.sleep(0)


async def test_on_postgresql_a_poisoned_workspace_is_refused_with_a_reason(
    tmp_path: Path, start_runtime_hub: Callable[..., HubProcess]
) -> None:
    """Issue 11 item 1 on PostgreSQL (there the hub started but the poisoned workspace
    answered ``internal`` forever): a log holding an event no reader can read back, planted in
    a schema; the hub starts and serves the other workspace, and the poisoned one is refused
    with ``unavailable`` and the reason, never ``internal``."""
    from tests.support.postgres import drop_schemas, need_postgres, new_schema, url_for

    need_postgres()
    schema = new_schema("quar")
    url = url_for(schema)
    data = tmp_path / "data"
    hub: HubProcess | None = None
    try:
        async with open_store(url, data) as store:
            for workspace in ("good", "bad"):
                await store.append(
                    workspace,
                    [MessagePosted(payload=MessagePayload(text="hi"), producer="alice")],
                )
            poison = MessagePosted(
                payload=MessagePayload(data=_deep(READ_MAX_DEPTH + 20)), producer="alice"
            )
            await store.append("bad", [poison])
        config = (
            f'[storage]\nstore = "{url}"\n\n'
            '[[backends]]\nid = "process"\nkind = "process"\naccess = "read-write"\n'
        )
        hub = start_runtime_hub(config, data_dir=data)
        async with exec_peer(hub.url) as p:
            published = await p.publish("bad", {"kind": "messagePosted", "payload": {"text": "x"}})
            fine = await p.publish("good", {"kind": "messagePosted", "payload": {"text": "x"}})
        assert fine["op"] == "ack", fine
        assert published["op"] == "error" and published["code"] == "unavailable", published
        assert "IntegrityError" in published["details"]["quarantined"], published
        assert "seq 2" in published["details"]["quarantined"], published
        assert "quarantined" in hub.log() and "Traceback" not in hub.log()
    finally:
        if hub is not None and hub.proc is not None and hub.proc.poll() is None:
            hub.terminate()
        drop_schemas([schema])


async def test_an_invalidated_index_makes_the_next_start_scan(tmp_path: Path) -> None:
    """``agora serve --workers`` keeps no index while its workers run: it marks the stored
    one stale after its own recovery, so whatever start comes next scans every workspace
    instead of trusting an index that missed what the workers opened."""
    async with open_store(None, tmp_path / "data") as store:
        index = RecoveryIndex(store)
        await index.open()
        index.members.add(("w", "alice"))
        await index.save()
        again = RecoveryIndex(store)
        await again.open()
        assert again.complete and again.members == {("w", "alice")}
        await again.invalidate()
        assert not again.enabled
        await again.save()  # no longer kept: a no-op, the stale mark stays
        after = RecoveryIndex(store)
        await after.open()
        assert not after.complete and after.members == set()
