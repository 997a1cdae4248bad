"""hub/server/reaper.py in-process: what a dead worker of ``agora serve --workers`` left open
is closed once, from the same rule as the cluster's (the black-box kill: test_workers.py)."""

from __future__ import annotations

from pathlib import Path

from hub.config import LimitsConfig
from hub.core.events import (
    Event,
    ExecFinished,
)
from hub.core.rules.recovery import closing_event_id
from hub.log.sqlite import SqliteEventStore
from hub.server.reaper import Reaped, WorkerReaper
from hub.workspaces import Workspaces
from tests.support.lifecycle import finished, requested, started


async def test_a_dead_workers_accepted_and_started_runs_are_closed_once(tmp_path: Path) -> None:
    db = tmp_path / "agora.db"
    # Written as the workers would have: each event in its own commit, by the asking agent.
    async with SqliteEventStore(db) as store:
        workspaces = Workspaces(store, snapshot_every=0)
        events: list[Event] = [
            requested("queued", "dead"),  # accepted by the dead worker, never started: closed
            requested("running", "dead"),
            started("running", "dead"),  # started there, not finished: closed
            requested("done", "dead"),
            finished("done"),  # finished: left alone
            requested("theirs", "alive"),  # a live worker's: left alone
            requested("old"),  # names no node (written before requests did): not found
        ]
        for event in events:
            await workspaces.publish("w", [event], producer="agent", trusted=True)
        await workspaces.aclose()

    async with SqliteEventStore(db) as supervisors:
        reaper = WorkerReaper(supervisors, LimitsConfig(), "supervisor")
        assert await reaper.close("dead", alive=["alive"]) == Reaped(executions=2, members=0)
        assert await reaper.close("dead", alive=["alive"]) == Reaped()  # nothing twice

    async with SqliteEventStore(db) as store:
        log = [e async for e in store.read("w")]
        workspaces = Workspaces(store, snapshot_every=0)
        state = await workspaces.state("w")
        await workspaces.aclose()
    closings = {e.payload.exec_id: e for e in log[len(events) :] if isinstance(e, ExecFinished)}
    assert sorted(closings) == ["queued", "running"] and len(log) == len(events) + 2
    request, start = log[0], log[2]
    assert closings["queued"].id == closing_event_id("w", "queued", request.seq)
    assert closings["queued"].causation_id == request.id
    assert closings["running"].causation_id == start.id
    for closing in closings.values():
        assert (closing.payload.status, closing.payload.reason) == ("failed", "interrupted")
        assert closing.producer == "agent"
        (note,) = closing.payload.diagnostics
        assert (note["node"], note["closedBy"]) == ("dead", "supervisor")
    assert state.executions["theirs"].status == "requested"
    assert state.executions["old"].status == "requested"
    assert state.executions["done"].status == "completed"
