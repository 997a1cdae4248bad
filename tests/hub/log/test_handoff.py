"""hub/log/handoff.py: what only the handoff does (the shared contract runs on it in
test_conformance.py and test_tree_conformance.py as the ``sqlite-handoff`` kind).

Over the real unix socket, in one process: the server takes hostile frames (too long, cut
short, not JSON, an unknown call, a call of bad values) without writing anything and keeps
serving its other connections; errors cross with their class; a batch too big for one frame
goes in several, in order; one append larger than a frame is refused with nothing written; a
worker whose writer goes away fails its calls ``unavailable`` and reconnects when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hub.core.chain import seal
from hub.core.errors import (
    BadRequest,
    Conflict,
    IntegrityError,
    Internal,
    TooLarge,
    Unavailable,
)
from hub.core.events import MessagePayload, MessagePosted
from hub.log import handoff
from hub.log.handoff import HandoffServer, HandoffStore, carried, raised
from hub.log.sqlite import SqliteEventStore
from tests.hub.log.stores import ServedHandoffStore
from tests.support.waiting import wait_for


def msg(text: str = "hi", *, id: str = "") -> MessagePosted:
    return MessagePosted(id=id, producer="p", payload=MessagePayload(text=text))


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[tuple[SqliteEventStore, HandoffServer]]:
    """The file's writer and its server, on a short socket path of its own."""
    async with (
        SqliteEventStore(tmp_path / "agora.db") as writer,
        HandoffServer(writer, _socket(tmp_path)) as server,
    ):
        yield writer, server


def _socket(tmp_path: Path) -> Path:
    return tmp_path / "w.sock"


async def _raw(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(str(path))


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server ends the connection (reads EOF) within a few seconds."""
    async with asyncio.timeout(5):
        return await reader.read() == b""


def _call(body: object) -> bytes:
    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


async def test_hostile_frames_close_their_connection_and_write_nothing(tmp_path: Path) -> None:
    hostile = [
        struct.pack(">I", handoff.FRAME_MAX + 1),  # a length over the limit, nothing after
        struct.pack(">I", 100) + b'["commit", 1',  # cut short, then the end of the stream
        _call(["commit", 1, [["append", "ws", [{"kind": "nope"}], None, None]]]),  # bad kind
        struct.pack(">I", 5) + b"{nope",  # not JSON
        _call(["dropEverything", 1]),  # no such call
        _call(["commit", "one", []]),  # a ref that is not a number
    ]
    async with (
        served(tmp_path) as (writer, server),
        HandoffStore(writer.path, socket=server.path) as worker,
    ):
        for data in hostile:
            reader, stream = await _raw(server.path)
            stream.write(data)
            if data.startswith(struct.pack(">I", 100)):
                stream.write_eof()
            await stream.drain()
            assert await _closed_by_server(reader)
            stream.close()
            # The other connection (a worker's store) is still served.
            assert (await worker.append("ok", [msg()])).seqs
        assert [h.workspace for h in await writer.heads()] == ["ok"]
        assert (await writer.head("ws")) is None


async def test_a_call_of_bad_values_is_refused_typed_with_nothing_written(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (writer, server):
        reader, stream = await _raw(server.path)
        draft = {"kind": "messagePosted", "producer": "p", "payload": {"text": "x"}}
        ops = [
            ["append", "../etc", [draft], None, None],  # a workspace name the log refuses
            ["append", "", [draft], None, None],  # no name at all
            ["append", "ws", [], None, None],  # no events
            ["append", "ws", [draft], -1, None],  # a negative expectedSeq
        ]
        no_checkpoint = ["cosign", 8, "ws", 3, "— witness c2ln\n"]  # none kept of size 3
        stream.write(_call(["commit", 7, ops]) + _call(no_checkpoint))
        await stream.drain()
        replies = []
        for _ in range(2):
            (size,) = struct.unpack(">I", await reader.readexactly(4))
            replies.append(json.loads(await reader.readexactly(size)))
        stream.close()
        by_ref = {reply[1]: reply for reply in replies}
        assert by_ref[7][0] == "outcomes"
        assert [o[0] for o in by_ref[7][2]] == ["error"] * 4
        assert [o[1] for o in by_ref[7][2]] == ["BadRequest"] * 4
        assert by_ref[8][0] == "failed" and by_ref[8][2][1] == "NotFound"
        assert await writer.heads() == []


class Subclassed(IntegrityError):
    """An error class the handoff does not name: it crosses as its nearest known class."""


def test_errors_cross_as_their_class_with_their_details() -> None:
    for error in (
        IntegrityError("gap at 3", workspace="w", seq=3),  # code "internal", like Internal
        Subclassed("a kind of integrity error", seq=2),
        Conflict("stale", head=4),
        BadRequest("no", field="$.x"),
        TooLarge("big", size=9, limit=1),
        Unavailable("later"),
        Internal("bug"),
    ):
        back = raised(carried(error))
        assert type(back) is (IntegrityError if type(error) is Subclassed else type(error))
        assert (back.message, back.details) == (error.message, error.details)
    # Details that do not encode are left out; an unknown class is Internal.
    assert raised(carried(Conflict("odd", head=object()))).details == {}
    assert type(raised(handoff.CarriedError("NoSuchError", "x"))) is Internal


async def test_a_batch_over_a_frame_is_handed_in_several_calls_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "FRAME_SOFT", 2048)
    calls: list[int] = []
    real = handoff._Link.send

    def counted(self: handoff._Link, make: Any) -> asyncio.Future[handoff.Answer]:
        calls.append(1)
        return real(self, make)

    monkeypatch.setattr(handoff._Link, "send", counted)
    async with ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        texts = [f"{i:03d}" + "x" * 400 for i in range(40)]
        results = await asyncio.gather(*(store.append("ws", [msg(t)]) for t in texts))
        assert len(calls) > 2  # (the first append may go alone, the rest queue behind it)
        events = [e async for e in store.read("ws")]
        assert [r.seqs[0] for r in results] == [e.seq for e in events] == list(range(1, 41))
        assert [e.payload.text for e in events] == texts  # type: ignore[attr-defined]


async def test_an_append_larger_than_a_frame_is_refused_alone_in_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "FRAME_MAX", 4096)
    monkeypatch.setattr(handoff, "FRAME_SOFT", 1024)
    async with ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        # One batch (queued in one loop iteration): small, too large, small.
        results = await asyncio.gather(
            store.append("a", [msg("small")]),
            store.append("b", [msg("x" * 8192)]),
            store.append("c", [msg("small")]),
            return_exceptions=True,
        )
        assert isinstance(results[1], TooLarge)
        assert [getattr(r, "seqs", None) for r in (results[0], results[2])] == [[1], [1]]
        assert await store.head("b") is None
        assert [h.workspace for h in await store.heads()] == ["a", "c"]


async def test_an_append_larger_than_a_frame_is_refused_with_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "FRAME_MAX", 4096)
    async with ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        with pytest.raises(TooLarge):
            await store.append("ws", [msg("x" * 8192)])
        assert await store.head("ws") is None
        assert (await store.append("ws", [msg("small")])).seqs == [1]  # the link still works


async def test_a_worker_whose_writer_goes_away_fails_unavailable_then_reconnects(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agora.db"
    async with SqliteEventStore(path) as writer:
        server = HandoffServer(writer, _socket(tmp_path))
        async with server:
            worker = HandoffStore(path, socket=server.path)
            await worker.open()
            assert (await worker.append("ws", [msg("1")])).seqs == [1]
        # The writer's server is gone (its process stopped): calls fail, typed, to retry.
        with pytest.raises(Unavailable):
            await worker.append("ws", [msg("2", id="two")])
        with pytest.raises(Unavailable):
            await worker.delete_snapshots("ws")
        async with HandoffServer(writer, _socket(tmp_path)):
            # Back: the retry (same id) is written once; the store reconnected by itself.
            first = await worker.append("ws", [msg("2", id="two")])
            again = await worker.append("ws", [msg("2", id="two")])
            assert first.seqs == [2] and again.duplicate and again.seqs == [2]
            await worker.close()
        assert [e.seq for e in await writer.read_batch("ws")] == [1, 2]


async def test_a_worker_needs_the_file_made_and_its_writer_up(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(Unavailable):
        await HandoffStore(missing, socket=_socket(tmp_path)).open()
    assert not missing.exists()  # the writer makes (and migrates) the file, never a worker
    path = tmp_path / "agora.db"
    async with SqliteEventStore(path):
        pass
    with pytest.raises(Unavailable, match="not reachable"):
        await HandoffStore(path, socket=_socket(tmp_path)).open()


async def test_a_worker_is_not_told_of_its_own_commits(tmp_path: Path) -> None:
    # follow() reports what other processes commit; a worker's own commits come back as the
    # answers to its calls, and a poll that reads one before its answer is recorded waits.
    store = ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs")
    store.follow_other_writers(0.001)
    heard: list[tuple[str, int]] = []
    async with store:
        follow = asyncio.create_task(
            store.follow(lambda w, head, *_: heard.append((w, head)), resumed=lambda: None)
        )
        try:
            await asyncio.sleep(0.05)
            for i in range(300):
                await store.append("mine", [msg(str(i))])
            # Another process's commit is told (here: the writer's own store, directly).
            await store.writer.append("theirs", [msg()])
            await wait_for(lambda: ("theirs", 1) in heard, within=10)
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
    assert heard == [("theirs", 1)]


async def test_a_dead_workers_last_calls_are_written_before_it_counts_as_drained(
    tmp_path: Path,
) -> None:
    # The supervisor reaps a dead worker once the server has written what its socket held
    # (hub.server.reaper): drained() waits for that connection's calls.
    async with served(tmp_path) as (writer, server):
        blocker = sqlite3.connect(writer.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the file's write lock, held: the call waits
        try:
            _, stream = await _raw(server.path)
            draft = {"kind": "messagePosted", "producer": "p", "payload": {"text": "last"}}
            stream.write(_call(["commit", 1, [["append", "ws", [draft], None, None]]]))
            await stream.drain()
            stream.close()  # the worker is gone; its call is still being written
            await asyncio.sleep(0.2)  # (the server has taken the connection and its call)
            drained = asyncio.create_task(server.drained(os.getpid()))
            await asyncio.sleep(0.3)
            assert not drained.done()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        async with asyncio.timeout(10):
            await drained
        assert (await writer.head("ws")) is not None


async def test_a_call_that_imports_a_log_is_not_overtaken(tmp_path: Path) -> None:
    imported = seal(
        msg("imported"),
        id="i1",
        workspace="y",
        seq=1,
        position=1,
        timestamp=1,
        producer="p",
        prev="",
    )
    first = handoff.CommitCall(
        1,
        [
            handoff.AppendOp("x", [msg("1")]),
            handoff.ImportOp("y", [imported]),
            handoff.AppendOp("x", [msg("2")]),
        ],
    )
    second = handoff.CommitCall(2, [handoff.AppendOp("x", [msg("3")])])
    async with served(tmp_path) as (writer, server):
        reader, stream = await _raw(server.path)
        stream.write(b"".join(handoff.frame(handoff._encoder.encode(c)) for c in (first, second)))
        await stream.drain()
        for _ in range(2):
            await handoff.read_frame(reader)
        stream.close()
        texts = [e.payload.text for e in await writer.read_batch("x")]  # type: ignore[attr-defined]
        assert texts == ["1", "2", "3"]
        assert (await writer.head("y")) is not None


async def test_the_server_holds_a_bounded_number_of_connections_and_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "CONNECTIONS_MAX", 1)
    monkeypatch.setattr(handoff, "BODY_TIMEOUT_S", 0.2)
    monkeypatch.setattr(handoff, "BYTES_IN_FLIGHT", 100)
    async with served(tmp_path) as (writer, server):
        first_reader, first = await _raw(server.path)
        # A frame whose body does not follow its length within the timeout ends the
        # connection; meanwhile a second connection is one too many.
        second_reader, second = await _raw(server.path)
        assert await _closed_by_server(second_reader)
        second.close()
        first.write(struct.pack(">I", 1000))
        await first.drain()
        assert await _closed_by_server(first_reader)
        first.close()
        # Calls larger than the bytes a connection may have in flight run one at a time.
        reader, stream = await _raw(server.path)
        draft = {"kind": "messagePosted", "producer": "p", "payload": {"text": "x" * 200}}
        calls = [_call(["commit", i, [["append", "ws", [draft], None, None]]]) for i in range(5)]
        stream.write(b"".join(calls))
        await stream.drain()
        async with asyncio.timeout(10):
            for _ in range(5):
                await handoff.read_frame(reader)
        stream.close()
        assert [e.seq for e in await writer.read_batch("ws")] == [1, 2, 3, 4, 5]


async def test_a_call_the_writer_does_not_answer_in_time_fails_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "CALL_TIMEOUT_S", 0.3)
    async with ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        blocker = sqlite3.connect(store.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the writer waits for the lock (busy timeout)
        try:
            with pytest.raises(Unavailable, match="did not answer"):
                await store.append("ws", [msg("late", id="late")])
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        # Written after all once the lock went: the retry by id says so.
        retry = await store.append("ws", [msg("late", id="late")])
        assert retry.duplicate and retry.seqs == [1]
