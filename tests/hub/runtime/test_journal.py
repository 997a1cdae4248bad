"""hub/runtime/journal.py: journals kept current from the log, reading executions back, and
live readers (replay then live, no gap or duplicate, overflow falls back to the log)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hub.core.errors import Busy, NotFound
from hub.core.events import (
    Event,
    ExecDisposed,
    ExecDisposedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    MessagePayload,
    MessagePosted,
)
from hub.log.factory import open_store
from hub.runtime.journal import Journals
from hub.workspaces import Workspaces


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    async with open_store(None, tmp_path / "data") as store:
        yield Workspaces(store)


async def put(ws: Workspaces, *events: Event) -> None:
    await ws.publish("w", list(events), producer="alice", trusted=True)


def requested(exec_id: str = "x", encoding: str | None = "utf8") -> ExecRequested:
    return ExecRequested(
        payload=ExecRequestedPayload(exec_id=exec_id, backend="process", encoding=encoding)
    )


def started(exec_id: str = "x") -> ExecStarted:
    return ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="process"))


def output(n: int, data: bytes, exec_id: str = "x", stream: Any = "stdout") -> ExecOutput:
    return ExecOutput(payload=ExecOutputPayload(exec_id, stream, n, data))


def finished(exec_id: str = "x") -> ExecFinished:
    return ExecFinished(
        payload=ExecFinishedPayload(exec_id=exec_id, status="completed", reason="exit", exit_code=0)
    )


async def test_loaded_lazily_then_kept_current(workspaces: Workspaces) -> None:
    journals = Journals(workspaces)
    workspaces.add_listener(journals)
    await put(workspaces, requested(), started(), output(1, b"a"))
    journal = await journals.get("w")
    await put(workspaces, MessagePosted(payload=MessagePayload(text="hi")), output(2, b"b"))
    rec = journal.record("x")
    assert rec is not None and rec.status == "running" and rec.output == []  # not kept
    assert journal.last_n["x"] == 2 and journal.encodings["x"] == "utf8"
    assert journal.seq == 5
    await put(workspaces, finished())
    assert rec.finished_seq == 6 and journal.finished_at["x"] > 0 and rec.request is None
    full = await journals.read_execution(journal, rec)
    assert full.stream_bytes("stdout") == b"ab" and full.result is not None
    await put(workspaces, ExecDisposed(payload=ExecDisposedPayload(exec_id="x")))
    assert journal.record("x") is None and "x" not in journal.request_ids


async def test_commits_during_the_load_are_not_lost(
    workspaces: Workspaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    journals = Journals(workspaces)
    workspaces.add_listener(journals)
    await put(workspaces, requested())
    read_batch = workspaces.store.read_batch
    calls = 0

    async def slow_read(*args: Any, **kwargs: Any) -> list[Event]:
        nonlocal calls
        page = await read_batch(*args, **kwargs)
        calls += 1
        if calls == 1:  # commit while the load is between reading and folding
            await put(workspaces, started(), output(1, b"late"))
        return page

    monkeypatch.setattr(workspaces.store, "read_batch", slow_read)
    journal = await journals.get("w")
    monkeypatch.undo()
    rec = journal.record("x")
    assert rec is not None and rec.status == "running" and journal.last_n["x"] == 1


async def test_finished_waits(workspaces: Workspaces) -> None:
    journals = Journals(workspaces)
    workspaces.add_listener(journals)
    await put(workspaces, requested(), started())
    journal = await journals.get("w")
    waiter = asyncio.create_task(journal.finished("x"))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await put(workspaces, finished())
    assert (await waiter).status == "completed"
    with pytest.raises(NotFound):
        await journal.finished("nope")


async def collect(follower: Any) -> list[Event]:
    return [e async for e in follower.events()]


async def test_a_follower_replays_then_follows_live(workspaces: Workspaces) -> None:
    journals = Journals(workspaces, max_readers=2)
    workspaces.add_listener(journals)
    await put(workspaces, requested(), requested("other"), started(), output(1, b"1"))
    journal = await journals.get("w")
    full = journals.follow(journal, "x", "full")
    tail = journals.follow(journal, "x", "tail")
    with pytest.raises(Busy):
        journals.follow(journal, "x", "full")
    with pytest.raises(NotFound):
        journals.follow(journal, "nope", "full")
    tasks = [asyncio.create_task(collect(f)) for f in (full, tail)]
    await asyncio.sleep(0.01)
    await put(workspaces, output(2, b"2"), output(1, b"o", "other"), finished())
    got_full, got_tail = await asyncio.gather(*tasks)
    full.close()
    tail.close()
    assert [e.kind for e in got_full] == [
        "execRequested",
        "execStarted",
        "execOutput",
        "execOutput",
        "execFinished",
    ]
    assert [e.seq for e in got_full] == sorted({e.seq for e in got_full})
    assert [e.kind for e in got_tail] == ["execOutput", "execFinished"]
    assert full.status == "completed"
    after_1 = journals.follow(journal, "x", 1)
    assert [
        (e.kind, getattr(getattr(e, "payload", None), "n", None)) for e in await collect(after_1)
    ] == [
        ("execOutput", 2),
        ("execFinished", None),
    ]
    after_1.close()
    assert journal.followers == {}


async def test_a_slow_follower_falls_back_to_the_log(workspaces: Workspaces) -> None:
    journals = Journals(workspaces, max_pending=2)
    workspaces.add_listener(journals)
    await put(workspaces, requested(), started())
    journal = await journals.get("w")
    follower = journals.follow(journal, "x", "full")
    events = follower.events()
    assert (await anext(events)).kind == "execRequested"
    for n in range(1, 11):  # the reader is not reading: its queue overflows
        await put(workspaces, output(n, str(n).encode()))
    await put(workspaces, finished())
    rest = [e async for e in events]
    follower.close()
    outputs = [e.payload.n for e in rest if isinstance(e, ExecOutput)]
    assert outputs == list(range(1, 11))  # nothing lost, nothing twice
    assert rest[-1].kind == "execFinished"
