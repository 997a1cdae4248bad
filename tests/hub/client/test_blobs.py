"""Blobs through the WebSocket door, over real hubs on SQLite and PostgreSQL: a 50 MiB file
written by one agent and read back byte-identical by another, an interrupted upload resumed,
ranged and streamed reads, artifacts, and what is refused (a wrong hash, a blob the
workspace does not reference, a chunk that leaves a gap, over the size limit and quota)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hub.client import connect
from hub.core.errors import NotFound, TooLarge
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import peer
from tests.support.postgres import drop_schemas, need_postgres, new_schema, url_for

MIB = 1024 * 1024


@pytest.fixture(params=["sqlite", "postgres"], scope="module")
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubProcess]:
    schemas: list[str] = []
    args: list[str] = []
    if request.param == "postgres":
        need_postgres()
        schemas.append(new_schema("t_blobs"))
        args = ["--store", url_for(schemas[0])]
    starter = HubStarter(tmp_path_factory.mktemp("blobs"))
    config = "[limits]\nmax_workspace_bytes = 134217728\nmax_blob_bytes = 100000000\n"
    try:
        yield starter.start(config, args=args)
    finally:
        starter.close()
        drop_schemas(schemas)


def _ws() -> str:
    return f"b-{os.urandom(6).hex()}"


async def test_50_mib_file_written_by_one_agent_read_by_another(site: HubProcess) -> None:
    name = _ws()
    data = os.urandom(50 * MIB)
    seen: list[tuple[int, int]] = []
    async with connect(site.url, site.token("alice")) as alice:
        written = await alice.workspace(name).write_file(
            "data/big.bin", data, progress=lambda done, total: seen.append((done, total))
        )
    assert written.payload.blob == hashlib.sha256(data).hexdigest()
    assert seen[-1] == (len(data), len(data))
    async with connect(site.url, site.token("bob")) as bob:
        ws = bob.workspace(name)
        state = await ws.state()
        entry = state.files["data/big.bin"]
        assert (entry.size, entry.sha256) == (len(data), written.payload.blob)
        back = await ws.read_file("data/big.bin")
        assert isinstance(back, bytes)
        assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest()


async def test_large_text_reads_back_as_text_and_streams_by_range(
    site: HubProcess, tmp_path: Path
) -> None:
    text = "é" * 200_000  # 400 kB of UTF-8: above the inline threshold
    async with connect(site.url, site.token("alice")) as alice:
        ws = alice.workspace(_ws())
        ev = await ws.write_file("notes.txt", text)
        assert await ws.read_file("notes.txt") == text
        assert ev.payload.blob is not None
        part = b"".join([c async for c in ws.open_blob(ev.payload.blob, offset=10, length=7)])
        assert part == text.encode()[10:17]
        out = await ws.get_blob(ev.payload.blob, tmp_path / "notes.copy")
        assert isinstance(out, Path) and out.read_bytes() == text.encode()


async def test_interrupted_upload_is_resumed(site: HubProcess) -> None:
    name = _ws()
    data = os.urandom(3 * MIB + 17)
    sha = hashlib.sha256(data).hexdigest()
    half = 256 * 1024 * 5
    # A raw client sends the first chunks, then its connection drops.
    async with peer(site.url, site.token("alice")) as p:
        status = await p.call("putBlob", workspace=name, sha256=sha, size=len(data))
        assert (status["op"], status["offset"]) == ("blobStatus", 0)
        for at in range(0, half, 256 * 1024):
            chunk = base64.b64encode(data[at : at + 256 * 1024]).decode()
            reply = await p.call(
                "blobChunk", workspace=name, sha256=sha, size=len(data), offset=at, data=chunk
            )
            assert reply["offset"] == at + 256 * 1024, reply
    seen: list[int] = []
    async with connect(site.url, site.token("alice")) as alice:
        ws = alice.workspace(name)
        got = await ws.put_blob(data, progress=lambda done, _total: seen.append(done))
        assert got == sha
        assert seen[0] == half  # resumed where the hub was, not from 0
        await ws.publish_artifact("report", data, "application/x-test")
    async with connect(site.url, site.token("bob")) as bob:
        ws = bob.workspace(name)
        art = (await ws.state()).artifacts["report"]
        assert (art.sha256, art.size_bytes, art.media_type) == (
            sha,
            len(data),
            "application/x-test",
        )
        assert await ws.get_blob(sha) == data


async def test_refusals(site: HubProcess) -> None:
    name = _ws()
    async with peer(site.url, site.token("alice")) as p:
        data = b"x" * 1000
        wrong = "0" * 64
        await p.call("putBlob", workspace=name, sha256=wrong, size=len(data))
        await p.call(
            "blobChunk",
            workspace=name,
            sha256=wrong,
            size=len(data),
            offset=0,
            data=base64.b64encode(data).decode(),
        )
        reply = await p.call("commitBlob", workspace=name, sha256=wrong, size=len(data))
        assert reply["code"] == "badRequest" and "hash" in reply["message"], reply
        sha = hashlib.sha256(data).hexdigest()
        await p.call("putBlob", workspace=name, sha256=sha, size=len(data))
        gap = await p.call(
            "blobChunk", workspace=name, sha256=sha, size=len(data), offset=500, data=""
        )
        assert gap["code"] == "badRequest" and gap["details"]["offset"] == 0, gap
        unbegun = await p.call(
            "blobChunk", workspace=name, sha256="cd" * 32, size=10, offset=0, data=""
        )
        assert unbegun["code"] == "notFound", unbegun  # only through putBlob
        over = await p.call("putBlob", workspace=name, sha256=sha, size=200_000_000)
        assert over["code"] == "tooLarge", over
        # A blob the workspace does not reference cannot be read through it.
        missing = await p.call("getBlob", workspace=name, sha256=sha)
        assert missing["code"] == "notFound", missing
        # A reference to a blob that is not stored is refused, nothing written.
        ref = await p.publish(
            name, {"kind": "fileWritten", "payload": {"path": "a", "blob": "ab" * 32}}
        )
        assert ref["code"] == "notFound", ref
        art = await p.publish(
            name,
            {"kind": "artifactPublished", "payload": {"key": "k", "blob": "ab" * 32}},
        )
        assert art["code"] == "notFound", art
    async with connect(site.url, site.token("alice")) as alice:
        ws = alice.workspace(name)
        with pytest.raises(NotFound):
            await ws.get_blob("cd" * 32)
        with pytest.raises(NotFound):
            await ws.read_file("a")  # the refused write left nothing


async def test_open_uploads_per_agent_are_bounded(site: HubProcess) -> None:
    name = _ws()
    async with peer(site.url, site.token("mallory")) as p:
        for i in range(16):
            sha = hashlib.sha256(str(i).encode()).hexdigest()
            reply = await p.call("putBlob", workspace=name, sha256=sha, size=10)
            assert reply["op"] == "blobStatus", reply
            again = await p.call("putBlob", workspace=name, sha256=sha, size=10)
            assert again["op"] == "blobStatus", again  # a resume is no new upload
        extra = hashlib.sha256(b"one more").hexdigest()
        reply = await p.call("putBlob", workspace=name, sha256=extra, size=10)
        assert (reply["op"], reply["code"]) == ("error", "busy"), reply


async def test_quota(site: HubProcess) -> None:
    name = _ws()
    async with connect(site.url, site.token("alice")) as alice:
        ws = alice.workspace(name)
        await ws.write_file("one.bin", os.urandom(90 * MIB))

        async def stream() -> AsyncIterator[bytes]:
            for _ in range(50):
                yield os.urandom(MIB)

        with pytest.raises(TooLarge) as info:
            await ws.put_blob(stream())
        assert "quota" in info.value.message
