"""Blobs through the WebSocket door, over real hubs on SQLite and PostgreSQL: a 50 MiB file
written by one agent and read back byte-identical by another, an interrupted upload resumed,
ranged and streamed reads, artifacts, and what is refused (a wrong hash, a blob the
workspace does not reference, a chunk that leaves a gap, over the size limit and quota)."""

from __future__ import annotations

import asyncio
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


# -- attacks (issue 14) ------------------------------------------------------------------------

CHUNK = 512 * 1024


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_a_second_uploader_cannot_change_the_bytes_being_committed(site: HubProcess) -> None:
    """Mallory knows the hash of Alice's content and writes chunks to the same (sha, size)
    while Alice commits: what is stored under the hash is still Alice's bytes."""
    for _round in range(3):
        name = _ws()
        data = os.urandom(8 * MIB)
        sha = hashlib.sha256(data).hexdigest()
        async with (
            peer(site.url, site.token("alice")) as alice,
            peer(site.url, site.token("mallet")) as mallory,
        ):
            await alice.call("putBlob", workspace=name, sha256=sha, size=len(data))
            await mallory.call("putBlob", workspace=name, sha256=sha, size=len(data))
            for at in range(0, len(data), CHUNK):
                reply = await alice.call(
                    "blobChunk",
                    workspace=name,
                    sha256=sha,
                    size=len(data),
                    offset=at,
                    data=_b64(data[at : at + CHUNK]),
                )
                assert reply["op"] == "blobStatus", reply

            async def junk(name: str, sha: str, size: int) -> None:
                for _ in range(8):
                    await mallory.call(
                        "blobChunk",
                        workspace=name,
                        sha256=sha,
                        size=size,
                        offset=0,
                        data=_b64(os.urandom(CHUNK)),
                    )

            committed, _ = await asyncio.gather(
                alice.call("commitBlob", workspace=name, sha256=sha, size=len(data)),
                junk(name, sha, len(data)),
            )
            assert committed["op"] == "blobStatus" and committed["stored"], committed
        async with connect(site.url, site.token("alice")) as client:
            ws = client.workspace(name)
            await ws.publish_artifact("a", data, "application/x-test")
            back = await ws.get_blob(sha)
            assert isinstance(back, bytes)
            assert hashlib.sha256(back).hexdigest() == sha


async def test_knowing_a_hash_opens_nothing(site: HubProcess) -> None:
    secret, theirs = _ws(), _ws()
    data = os.urandom(MIB)
    async with connect(site.url, site.token("alice", [secret])) as alice:
        written = await alice.workspace(secret).write_file("secret.bin", data)
    sha = written.payload.blob
    assert sha is not None
    async with peer(site.url, site.token("eve", [theirs])) as p:
        status = await p.call("putBlob", workspace=theirs, sha256=sha, size=len(data))
        assert status["op"] == "blobStatus", status
        assert (status.get("stored", False), status["offset"]) == (False, 0), (
            status
        )  # upload the bytes
        commit = await p.call("commitBlob", workspace=theirs, sha256=sha, size=len(data))
        assert commit["code"] == "badRequest", commit  # nothing uploaded
        for kind, payload in [
            ("fileWritten", {"path": "stolen.bin", "blob": sha}),
            ("artifactPublished", {"key": "stolen", "blob": sha}),
        ]:
            ref = await p.publish(theirs, {"kind": kind, "payload": payload})
            assert ref["code"] == "notFound", ref
        got = await p.call("getBlob", workspace=theirs, sha256=sha)
        assert got["code"] == "notFound", got
    # Who holds the bytes may store and reference them: the hub checked the hash.
    async with connect(site.url, site.token("bob", [theirs])) as bob:
        ws = bob.workspace(theirs)
        assert await ws.put_blob(data) == sha
        await ws.publish_artifact("mine", data, "application/x-test")
        assert await ws.get_blob(sha) == data


@pytest.fixture(params=["sqlite", "postgres"], scope="module")
def small(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HubProcess]:
    schemas: list[str] = []
    args: list[str] = []
    if request.param == "postgres":
        need_postgres()
        schemas.append(new_schema("t_quota"))
        args = ["--store", url_for(schemas[0])]
    starter = HubStarter(tmp_path_factory.mktemp("quota"))
    config = "[limits]\nmax_workspace_bytes = 1000000\nmax_blob_bytes = 1000000\n"
    try:
        yield starter.start(config, args=args)
    finally:
        starter.close()
        drop_schemas(schemas)


async def test_committed_unreferenced_blobs_count_against_the_quota(small: HubProcess) -> None:
    name = _ws()
    async with connect(small.url, small.token("alice")) as alice:
        ws = alice.workspace(name)
        await ws.put_blob(os.urandom(400_000))
        await ws.put_blob(os.urandom(400_000))
        with pytest.raises(TooLarge) as info:
            await ws.put_blob(os.urandom(400_000))
        assert "quota" in info.value.message
        # Referencing what was uploaded costs nothing more; content past the quota is refused
        # at publish too (the large inline write becomes a blob).
        with pytest.raises(TooLarge):
            await ws.write_file("more.bin", os.urandom(300_000))


async def test_the_client_bounds_what_it_spools_and_holds(site: HubProcess) -> None:
    from hub.client import blobs as blob_io

    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for i in range(1000):  # bounded all the same
            sent.append(i)
            yield b"x" * MIB

    async with connect(site.url, site.token("alice")) as alice:
        ws = alice.workspace(_ws())
        with pytest.raises(TooLarge):
            await blob_io.upload(ws.session, ws.name, endless(), max_bytes=3 * MIB)
        assert len(sent) == 4  # stopped spooling at the limit
        data = os.urandom(MIB)
        await ws.publish_artifact("a", data, "application/x-test")
        sha = hashlib.sha256(data).hexdigest()
        with pytest.raises(TooLarge):
            await blob_io.download(ws.session, ws.name, sha, max_bytes=100_000)
        assert await blob_io.download(ws.session, ws.name, sha, max_bytes=MIB) == data
