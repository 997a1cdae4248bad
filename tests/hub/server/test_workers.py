"""``agora serve --workers 2``, black-box: real processes, real sockets, raw clients.

A client that reaches either worker is served as if it were on the owner of each workspace it
uses (hub.server.workers): acks with their rids, events in order with no gap and no duplicate,
resume with ``afterSeq``. A write from another process (``agora append``) reaches the owner's
subscribers. A worker killed with SIGKILL is started again, and its clients reconnect and
resume. The start-up recovery has run when the workers serve. Workers stop when their
supervisor is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from hub.client import Subscription, connect
from hub.commands.serve import ORPHAN_CHECK_S
from hub.core.events import (
    Event,
    ExecFinished,
    ExecRequested,
    ExecStarted,
    MemberJoined,
    MemberLeft,
)
from hub.core.execution.settings import RuntimeSettings
from hub.core.sharding import owner_of
from hub.log.sqlite import SqliteEventStore
from tests.support.docker import need_docker
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import Peer, message, open_peer
from tests.support.postgres import drop_schemas, need_postgres, new_schema, url_for
from tests.support.tokens import SECRET, mint, mint_exec
from tests.support.waiting import wait_for

WORKERS = 2
WITHIN_S = 30.0  # to land a connection on a given worker (the kernel spreads them)


def owned_by(index: int, prefix: str = "w") -> str:
    """A workspace name that worker ``index`` owns."""
    n = 0
    while owner_of(f"{prefix}-{n}", WORKERS) != index:
        n += 1
    return f"{prefix}-{n}"


@contextlib.asynccontextmanager
async def on_worker(url: str, index: int, agent: str = "alice") -> AsyncIterator[Peer]:
    """A connected, authenticated peer on worker ``index`` (the welcome's ``server`` says)."""
    deadline = time.monotonic() + WITHIN_S
    while time.monotonic() < deadline:
        async with open_peer(Peer, url) as p:
            await p.send({"op": "hello", "rid": 0, "token": mint(agent)})
            welcome = await p.recv()
            assert welcome["op"] == "welcome", welcome
            if welcome["server"].endswith(f"worker/{index}"):
                yield p
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no connection reached worker {index} in {WITHIN_S} s")


async def publish_pipelined(p: Peer, workspace: str, count: int, tag: str) -> list[int]:
    """Send ``count`` publishes without waiting, then read every ack; the seqs by rid order."""
    for i in range(count):
        await p.send(
            {
                "op": "publish",
                "rid": f"{tag}-{i}",
                "workspace": workspace,
                "event": message(f"{tag}-{i}"),
            }
        )
    seqs: dict[str, int] = {}
    async with asyncio.timeout(20):
        while len(seqs) < count:
            frame = json.loads(await p.ws.recv())
            if frame.get("op") == "event":
                p.inbox.append(frame)
                continue
            assert frame["op"] == "ack", frame
            seqs[frame["rid"]] = frame["seq"]
    return [seqs[f"{tag}-{i}"] for i in range(count)]


async def texts(p: Peer, workspace: str, after: int, until_seq: int) -> list[tuple[int, str]]:
    """The messages of ``workspace`` after seq ``after`` up to ``until_seq``, checking that
    every seq comes once, in order (subscribing also writes memberJoined events). Frames of
    other workspaces stay in the peer's inbox."""
    events: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    async with asyncio.timeout(20):
        while not events or events[-1]["seq"] < until_seq:
            frame = await p.recv()
            if frame.get("op") == "event" and frame.get("workspace") == workspace:
                events.append(frame["event"])
            else:
                kept.append(frame)
    p.inbox[:0] = kept
    assert [e["seq"] for e in events] == list(range(after + 1, until_seq + 1)), events
    return [(e["seq"], e["payload"]["text"]) for e in events if e["kind"] == "messagePosted"]


def increasing(seqs: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(seqs))


def start(tmp_path: Path) -> tuple[HubStarter, HubProcess]:
    starter = HubStarter(tmp_path)
    return starter, starter.start(args=["--workers", str(WORKERS)])


async def test_publish_and_subscribe_across_workers(tmp_path: Path) -> None:
    starter, hub = start(tmp_path)
    try:
        w0, w1 = owned_by(0), owned_by(1)
        async with (
            on_worker(hub.url, 0) as a0,
            on_worker(hub.url, 1) as a1,
            on_worker(hub.url, 0) as s0,
            on_worker(hub.url, 1) as s1,
        ):
            # Each subscriber on the worker that does NOT own the workspace, and on the one
            # that does.
            starts: dict[tuple[int, str], int] = {}
            for i, (s, workspaces) in enumerate(((s0, (w1, w0)), (s1, (w0, w1)))):
                for w in workspaces:
                    reply = await s.call("subscribe", workspace=w)
                    assert reply["op"] == "subscribed", reply
                    starts[i, w] = reply["head"]
            # Publishers pipelined onto the workspace the other worker owns.
            seqs1, seqs0 = await asyncio.gather(
                publish_pipelined(a0, w1, 40, "a0"), publish_pipelined(a1, w0, 40, "a1")
            )
            assert increasing(seqs1) and increasing(seqs0), (seqs1, seqs0)
            want1 = [(seq, f"a0-{i}") for i, seq in enumerate(seqs1)]
            want0 = [(seq, f"a1-{i}") for i, seq in enumerate(seqs0)]
            for i, s in enumerate((s0, s1)):
                got1 = await texts(s, w1, starts[i, w1], seqs1[-1])
                assert got1[-40:] == want1
                got0 = await texts(s, w0, starts[i, w0], seqs0[-1])
                assert got0[-40:] == want0
            # Resume from afterSeq on the worker that does not own it: catch-up, then live.
            async with on_worker(hub.url, 0) as late:
                after = seqs1[24]
                reply = await late.call("subscribe", workspace=w1, afterSeq=after)
                assert reply["op"] == "subscribed" and reply["head"] == seqs1[-1], reply
                assert await texts(late, w1, after, seqs1[-1]) == want1[25:]
                ack = await a1.publish(w1, message("live"))
                assert ack["op"] == "ack", ack
                seq = ack["seq"]
                # (late's own memberJoined may come first)
                assert (await texts(late, w1, seqs1[-1], seq))[-1:] == [(seq, "live")]
                # Presence is the owner's alone: alice, subscribed on both workers, joined once.
                full = await late.call("subscribe", workspace=w0, afterSeq=0)
                log = await late.events(w0, full["head"])
                joins = [e for e in log if e["kind"] == "memberJoined"]
                assert len(joins) == 1, joins
                # An error answer keeps its rid across the relay.
                bad = await late.call("publish", workspace=w1, event=message(), expectedSeq=3)
                assert bad["op"] == "error" and bad["code"] == "conflict", bad
    finally:
        starter.close()


async def test_a_write_from_another_process_reaches_the_owner_subscribers(
    tmp_path: Path,
) -> None:
    starter, hub = start(tmp_path)
    try:
        for index in range(WORKERS):
            workspace = owned_by(index, "cli")
            async with on_worker(hub.url, 1 - index) as sub:  # through the relay
                reply = await sub.call("subscribe", workspace=workspace)
                assert reply["op"] == "subscribed", reply
                head = reply["head"]
                line = json.dumps(message("from the cli")) + "\n"
                append = await asyncio.create_subprocess_exec(
                    *[sys.executable, "-m", "hub", "append", workspace],
                    *["--data", str(hub.data_dir)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    env={**os.environ, "AGORA_SECRET": SECRET},
                )
                await asyncio.wait_for(append.communicate(line.encode()), 60)
                assert append.returncode == 0
                seen: list[dict[str, Any]] = []
                async with asyncio.timeout(20):
                    while not seen or seen[-1]["kind"] != "messagePosted":
                        frame = await sub.recv()
                        if frame.get("op") == "event":
                            seen.append(frame["event"])
                assert [e["seq"] for e in seen] == list(range(head + 1, head + 1 + len(seen)))
                assert seen[-1]["payload"]["text"] == "from the cli", seen
    finally:
        starter.close()


def write_lock_holders(shm: Path) -> set[int]:
    """The processes holding the write lock of the SQLite file whose shared memory is
    ``shm`` now: in WAL mode a writing transaction holds a POSIX lock on byte 120 of the
    ``-shm`` file (SQLite's WAL_WRITE_LOCK) from BEGIN to COMMIT; Linux lists it, with the
    holder's pid, in ``/proc/locks``."""
    inode = f":{shm.stat().st_ino}"
    holders: set[int] = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "7: POSIX  ADVISORY  WRITE 4242 fe:00:1474572 120 120" ("->" marks a waiter)
        if (
            len(fields) == 8
            and (fields[1], fields[3], fields[6]) == ("POSIX", "WRITE", "120")
            and fields[5].endswith(inode)
        ):
            holders.add(int(fields[4]))
    return holders


async def test_the_supervisor_is_the_files_only_writer(tmp_path: Path) -> None:
    # Workers taking turns at one SQLite file's write lock ingested less than one worker
    # (bench/workers_bench.py): they hand their writes to the supervisor (hub.log.handoff).
    starter, hub = start(tmp_path)
    try:
        assert hub.proc is not None
        shm = hub.data_dir / "agora.db-shm"
        holders: set[int] = set()
        writing = True

        async def watch() -> None:
            while writing:
                holders.update(write_lock_holders(shm))
                await asyncio.sleep(0.0005)

        async with on_worker(hub.url, 0) as p0, on_worker(hub.url, 1) as p1:
            watcher = asyncio.create_task(watch())
            try:
                await asyncio.gather(
                    publish_pipelined(p0, owned_by(0), 400, "p0"),
                    publish_pipelined(p1, owned_by(1), 400, "p1"),
                )
            finally:
                writing = False
                await watcher
        workers = {pid for _, pid in worker_pids(hub)}
        assert len(workers) == WORKERS
        assert holders == {hub.proc.pid}, (holders, workers)
    finally:
        starter.close()


def worker_pids(hub: HubProcess) -> list[tuple[int, int]]:
    """(index, pid) of every worker start the supervisor logged, in order."""
    return [
        (int(m[1]), int(m[2])) for m in re.finditer(r"worker (\d+) started pid=(\d+)", hub.log())
    ]


async def test_a_killed_worker_is_restarted_and_clients_resume(tmp_path: Path) -> None:
    starter, hub = start(tmp_path)
    try:
        w1 = owned_by(1)
        async with on_worker(hub.url, 0) as a0:
            seqs = []
            for i in range(5):
                ack = await a0.publish(w1, message(f"before-{i}"))
                seqs.append(ack["seq"])
            async with on_worker(hub.url, 1) as direct:
                assert (await direct.call("subscribe", workspace=w1))["op"] == "subscribed"
                (_, pid), *_ = [(i, p) for i, p in worker_pids(hub) if i == 1]
                os.kill(pid, signal.SIGKILL)
                # The direct client loses its socket; the relayed one is told to retry (1013).
                await direct.closed()
                closed = await a0.closed()
                assert closed.rcvd is not None and closed.rcvd.code == 1013, closed
        await wait_for(lambda: len([i for i, _ in worker_pids(hub) if i == 1]) == 2, 30)
        # Reconnect (until a connection lands on the restarted worker) and resume.
        async with on_worker(hub.url, 1) as again, on_worker(hub.url, 0) as a0:
            reply = await again.call("subscribe", workspace=w1, afterSeq=seqs[2])
            head = reply["head"]
            got = await texts(again, w1, seqs[2], head)
            assert got == [(seqs[3], "before-3"), (seqs[4], "before-4")], got
            ack = await a0.publish(w1, message("after"))
            assert ack["op"] == "ack", ack
            seq = ack["seq"]
            assert (await texts(again, w1, head, seq))[-1:] == [(seq, "after")]
    finally:
        starter.close()


SH_BACKEND = '[[backends]]\nid = "sh"\nkind = "process"\n'


async def next_of(
    feed: Subscription, kind: str, agent: str | None = None, within: float = 30.0
) -> Event:
    """The next event of ``kind`` the subscription delivers (about ``agent``, for presence)."""
    async with asyncio.timeout(within):
        while True:
            event = await anext(feed)
            if event.kind != kind:
                continue
            if agent is None or getattr(event.payload, "agent", None) == agent:
                return event


async def test_a_killed_workers_members_leave_and_its_executions_end_interrupted(
    tmp_path: Path,
) -> None:
    """Worker 1 killed with SIGKILL under alice's presence and her running execution: before
    it serves again, alice's membership through it gets ``memberLeft`` (reason
    ``interrupted``, naming its node) and the execution ``execFinished`` failed/interrupted
    (the dead node in the diagnostic), and bob's client, subscribed to the workspace, receives
    both once it has reconnected and resumed (hub.server.reaper)."""
    starter = HubStarter(tmp_path)
    hub = starter.start(config=SH_BACKEND, args=["--workers", str(WORKERS)])
    try:
        w = owned_by(1, "reaped")
        # The clients' defaults: worker 0 holds a relayed frame for worker 1 while it restarts
        # (hub.server.workers.OWNER_WAIT) rather than closing them again and again with 1013.
        async with (
            connect(hub.url, mint_exec("alice", backends=["sh"])) as alice,
            connect(hub.url, mint("bob")) as bob,
        ):
            seen = bob.workspace(w).subscribe(after_seq=0)
            await seen.head()
            present = alice.workspace(w).subscribe(after_seq=0)
            await present.head()  # alice joins, through the owner
            joined = await next_of(seen, "memberJoined", "alice")
            assert isinstance(joined, MemberJoined)
            dead = joined.payload.node
            assert dead is not None and "-w1." in dead, dead
            await alice.workspace(w).runtime.exec("sleep 60", backend="sh", id="long")
            started = await next_of(seen, "execStarted")
            assert isinstance(started, ExecStarted) and started.payload.node == dead
            (_, pid), *_ = [(i, p) for i, p in worker_pids(hub) if i == 1]
            os.kill(pid, signal.SIGKILL)
            finished = await next_of(seen, "execFinished", within=60)
            assert isinstance(finished, ExecFinished), finished
            assert finished.payload.exec_id == "long"
            assert (finished.payload.status, finished.payload.reason) == ("failed", "interrupted")
            (note,) = finished.payload.diagnostics
            assert note["node"] == dead and note["code"] == "interrupted", note
            # Then the members: alice's leave comes before her client's return.
            left = await next_of(seen, "memberLeft", "alice", within=60)
            assert isinstance(left, MemberLeft), left
            assert left.payload.reason == "interrupted" and left.payload.node == dead, left
            back = await next_of(seen, "memberJoined", "alice", within=60)
            assert isinstance(back, MemberJoined) and back.payload.node not in (None, dead)
            assert bob.reconnects + alice.reconnects >= 1  # (a client of worker 1 came back)
        log = hub.stderr_path.read_text(errors="replace")  # (all of it: the workers' too)
        assert log.count("left 1 execution(s) and 2 member(s) open: closed") == 1
    finally:
        starter.close()


CONTAINER_BACKEND = '[[backends]]\nid = "box"\nkind = "container"\nlimits = { warm_pool = 1 }\n'


async def test_a_restarted_worker_leaves_the_other_workers_containers_alone(
    tmp_path: Path,
) -> None:
    """Worker 1 killed and started again sweeps the containers it left (its start's sweep),
    not those of worker 0 on the same data directory: worker 0's running execution is still
    running afterwards, and alice's kill ends it (exit 130). (Both once swept by one label per
    data directory: the restart removed worker 0's live container, ending its run with
    exit 137 before any kill.)"""
    need_docker()
    starter = HubStarter(tmp_path)
    hub = starter.start(config=CONTAINER_BACKEND, args=["--workers", str(WORKERS)])
    try:
        w0, w1 = owned_by(0, "boxed"), owned_by(1, "boxed")
        async with connect(hub.url, mint_exec("alice", backends=["box"])) as alice:
            seen = alice.workspace(w0).subscribe(after_seq=0)
            await seen.head()
            long = await alice.workspace(w0).runtime.exec("sleep 120", backend="box", id="long")
            await next_of(seen, "execStarted", within=60)
            (_, pid), *_ = [(i, p) for i, p in worker_pids(hub) if i == 1]
            os.kill(pid, signal.SIGKILL)
            await wait_for(lambda: len([i for i, _ in worker_pids(hub) if i == 1]) == 2, 30)
            # The restarted worker 1 has started its backend (swept) once it ran this.
            probe = await alice.workspace(w1).runtime.exec("echo hi", backend="box", id="probe")
            outcome = await probe.result()
            assert (outcome.status, outcome.stdout) == ("completed", "hi\n"), outcome
            await long.kill()
            ended = await long.result()
            # Killed by alice (130), not by a sweep (the SIGKILL of a removed container, 137).
            assert (ended.status, ended.exit_code) == ("cancelled", 130), ended
    finally:
        starter.close()


async def test_a_killed_workers_execution_never_started_ends_interrupted(
    tmp_path: Path,
) -> None:
    """Worker 1 killed with SIGKILL after accepting an execution it had not logged as
    started (a silent program: its ``execStarted`` waits for output or the coalescing
    interval): before it serves again, the request gets one ``execFinished``
    failed/interrupted naming the dead worker, caused by the ``execRequested``, which names
    it too (hub.server.reaper)."""
    starter = HubStarter(tmp_path)
    config = SH_BACKEND + "\n[runtime]\ncoalesce_interval_s = 600\n"
    hub = starter.start(config=config, args=["--workers", str(WORKERS)])
    try:
        w = owned_by(1, "quiet")
        async with (
            connect(hub.url, mint_exec("alice", backends=["sh"])) as alice,
            connect(hub.url, mint("bob")) as bob,
        ):
            seen = bob.workspace(w).subscribe(after_seq=0)
            await seen.head()
            await alice.workspace(w).runtime.exec("sleep 60", backend="sh", id="quiet")
            request = await next_of(seen, "execRequested")
            assert isinstance(request, ExecRequested), request
            dead = request.payload.node
            assert dead is not None and "-w1." in dead, dead
            (_, pid), *_ = [(i, p) for i, p in worker_pids(hub) if i == 1]
            os.kill(pid, signal.SIGKILL)
            finished = await next_of(seen, "execFinished", within=60)
            assert isinstance(finished, ExecFinished), finished
            assert finished.payload.exec_id == "quiet" and finished.causation_id == request.id
            assert (finished.payload.status, finished.payload.reason) == ("failed", "interrupted")
            (note,) = finished.payload.diagnostics
            assert note["node"] == dead and note["code"] == "interrupted", note
    finally:
        starter.close()
    log = hub.stderr_path.read_text(errors="replace")
    assert len(re.findall(r"left 1 execution\(s\) and \d+ member\(s\) open", log)) == 1
    async with SqliteEventStore(hub.data_dir / "agora.db") as store:  # (every process gone)
        kinds = [e.kind async for e in store.read(w) if e.kind.startswith("exec")]
    assert kinds == ["execRequested", "execFinished"], kinds


def appended(exposition: str) -> dict[str, float]:
    """``agora_events_appended_total`` of a scrape, by its ``worker`` label ("" without)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "agora_events_appended_total":
                out[sample.labels.get("worker", "")] = sample.value
    return out


async def test_metrics_count_the_events_of_every_worker(tmp_path: Path) -> None:
    """One scrape of /metrics (worker 0's HTTP port) counts what each worker appended, each
    with its ``worker`` label, and says both are up."""
    starter = HubStarter(tmp_path)
    hub = starter.start(http_port=0, args=["--workers", str(WORKERS)])
    try:
        counts = {0: 3, 1: 5}
        async with on_worker(hub.url, 0) as p:  # through the relay for worker 1's
            for index, count in counts.items():
                for i in range(count):
                    ack = await p.publish(owned_by(index, "metrics"), message(f"{i}"))
                    assert ack["op"] == "ack", ack
        async with httpx.AsyncClient(base_url=hub.http_url) as http:
            reply = await http.get("/metrics")
        assert reply.status_code == 200, reply.text
        assert appended(reply.text) == {"0": 3.0, "1": 5.0}, reply.text
        up = [line for line in reply.text.splitlines() if line.startswith("agora_worker_up")]
        assert up == ['agora_worker_up{worker="0"} 1.0', 'agora_worker_up{worker="1"} 1.0'], up
    finally:
        starter.close()


async def test_startup_recovery_runs_before_the_workers_serve(tmp_path: Path) -> None:
    """A member a killed hub left present is recorded as gone (once) by the time a client of
    a worker reads the log: the supervisor recovered before starting them. (Recovery by
    every worker as well would not fail this test: the rules refuse a second memberLeft.)"""
    starter = HubStarter(tmp_path)
    data = tmp_path / "data"
    try:
        single = starter.start(data_dir=data)
        async with open_peer(Peer, single.url, mint("bob")) as bob:
            assert (await bob.call("subscribe", workspace="left"))["op"] == "subscribed"

            async def joined() -> bool:  # memberJoined is written
                return await bob.head("left") >= 1

            await wait_for(joined)
            single.kill()
        hub = starter.start(data_dir=data, args=["--workers", str(WORKERS)])
        async with on_worker(hub.url, owner_of("left", WORKERS)) as reader:
            reply = await reader.call("subscribe", workspace="left", afterSeq=0)
            head = reply["head"]
            events: list[dict[str, Any]] = await reader.events("left", head)
        kinds = [e["kind"] for e in events]
        assert kinds == ["memberJoined", "memberLeft"], kinds
        assert events[-1]["payload"]["reason"] == "interrupted", events[-1]
    finally:
        starter.close()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# A worker notices within ORPHAN_CHECK_S, then stops as any hub: at most close_grace_s for its
# runs and as long for its backends (hub.runtime), whatever its Docker engine does.
ORPHAN_STOP_S = ORPHAN_CHECK_S + 2 * RuntimeSettings().close_grace_s + 5


async def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    starter, hub = start(tmp_path)
    try:
        pids = [pid for _, pid in worker_pids(hub)]
        assert len(pids) == WORKERS and all(_alive(p) for p in pids)
        hub.kill()
        try:
            await wait_for(lambda: not any(_alive(p) for p in pids), ORPHAN_STOP_S)
        except AssertionError:
            alive = [p for p in pids if _alive(p)]
            raise AssertionError(
                f"workers {alive} alive after {ORPHAN_STOP_S} s:\n{hub.log()}"
            ) from None
    finally:
        starter.close()


async def test_on_a_shared_store_the_supervisor_leaves_live_nodes_alone(tmp_path: Path) -> None:
    """On PostgreSQL another node may hold what the log shows open: a ``--workers 2`` start
    must not record its present member as gone (the cluster recovers dead nodes only), and
    its workers serve the same log."""
    need_postgres()
    schema = new_schema("workers")
    url = url_for(schema)
    starter = HubStarter(tmp_path)
    try:
        node = starter.start(args=["--store", url])
        async with open_peer(Peer, node.url, mint("bob")) as bob:
            assert (await bob.call("subscribe", workspace="kept"))["op"] == "subscribed"

            async def joined() -> bool:
                return await bob.head("kept") >= 1

            await wait_for(joined)
            hub = starter.start(args=["--store", url, "--workers", str(WORKERS)])
            async with on_worker(hub.url, 1 - owner_of("kept", WORKERS)) as reader:
                ack = await reader.publish("kept", message("through the relay"))
                assert ack["op"] == "ack", ack
                reply = await reader.call("subscribe", workspace="kept", afterSeq=0)
                events = await reader.events("kept", ack["seq"])
            kinds = [e["kind"] for e in events]
            assert "memberLeft" not in kinds, kinds
            assert (await bob.head("kept")) >= reply["head"]  # the live node sees it too
    finally:
        starter.close()
        drop_schemas([schema])
