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
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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
        assert [o[0] for o in by_ref[7][2]] == ["error"] * 3
        assert [o[1] for o in by_ref[7][2]] == ["BadRequest"] * 3
        assert by_ref[8][0] == "failed" and by_ref[8][2][1] == "NotFound"
        assert await writer.heads() == []


def test_errors_cross_as_their_class_with_their_details() -> None:
    for error in (
        IntegrityError("gap at 3", workspace="w", seq=3),  # code "internal", like Internal
        Conflict("stale", head=4),
        BadRequest("no", field="$.x"),
        TooLarge("big", size=9, limit=1),
        Unavailable("later"),
        Internal("bug"),
    ):
        back = raised(carried(error))
        assert type(back) is type(error)
        assert (back.message, back.details) == (error.message, error.details)
    # Details that do not encode are left out; an unknown class is Internal.
    assert raised(carried(Conflict("odd", head=object()))).details == {}
    assert type(raised(handoff.CarriedError("NoSuchError", "x"))) is Internal


async def test_a_batch_over_a_frame_is_handed_in_several_calls_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handoff, "FRAME_SOFT", 2048)
    calls: list[int] = []
    real = handoff._Link.call

    async def counted(self: handoff._Link, make: object) -> handoff.Answer:
        calls.append(1)
        return await real(self, make)  # type: ignore[arg-type]

    monkeypatch.setattr(handoff._Link, "call", counted)
    async with ServedHandoffStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        texts = [f"{i:03d}" + "x" * 400 for i in range(40)]
        results = await asyncio.gather(*(store.append("ws", [msg(t)]) for t in texts))
        assert len(calls) > 2  # (the first append may go alone, the rest queue behind it)
        events = [e async for e in store.read("ws")]
        assert [r.seqs[0] for r in results] == [e.seq for e in events] == list(range(1, 41))
        assert [e.payload.text for e in events] == texts  # type: ignore[attr-defined]


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
