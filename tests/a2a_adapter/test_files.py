"""Files across the A2A door with an a2a-sdk client: a peer's file part becomes a blob and an
artifact (its bytes leave the message), an Agora artifact goes out as an A2A artifact with a
file part whose URL the peer fetches with its bearer token, byte-identical."""

from __future__ import annotations

import hashlib
import os
import uuid

import httpx
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)

from a2a_adapter.app import A2AService
from hub.core.events import ArtifactPayload, ArtifactPublished, Event
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, open_client


async def test_file_part_in_and_artifact_out(
    service: A2AService, workspaces: Workspaces, token: TokenFactory
) -> None:
    upload = os.urandom(200_000)
    async with open_client(service.url, token("peer"), streaming=False) as peer:
        message = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            context_id=WORKSPACE,
            parts=[
                Part(text="convert this"),
                Part(raw=upload, filename="data.csv", media_type="text/csv"),
            ],
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        replies = [r async for r in peer.send_message(request)]
        task_id = replies[0].task.id
        # The file part became a blob and an artifact of the task; the log keeps its URL.
        state = await workspaces.state(WORKSPACE)
        art = state.artifacts["data.csv"]
        sha = hashlib.sha256(upload).hexdigest()
        assert (art.blob, art.size_bytes, art.media_type) == (sha, len(upload), "text/csv")
        needs = [e async for e in workspaces.store.read(WORKSPACE) if e.kind == "needWork"]
        parts = needs[0].payload["parts"]  # type: ignore[attr-defined]
        assert parts[1]["url"] == f"/blobs/{WORKSPACE}/{sha}" and "raw" not in parts[1]

        # An agent of the workspace publishes a result; it crosses as an A2A artifact.
        result = os.urandom(300_000)
        blob = await workspaces.store.blobs.put(result)
        await workspaces.store.blobs.grant(WORKSPACE, blob, len(result), "worker")
        draft = ArtifactPublished(
            correlation_id=task_id,
            payload=ArtifactPayload(key="out.bin", media_type="application/x-bin", blob=blob),
        )
        await workspaces.publish(WORKSPACE, [draft], producer="worker")
        task = await peer.get_task(GetTaskRequest(id=task_id))
        (artifact,) = [a for a in task.artifacts if a.name == "out.bin"]
        (file_part,) = [p for p in artifact.parts if p.WhichOneof("content") == "url"]
        assert (file_part.filename, file_part.media_type) == ("out.bin", "application/x-bin")

    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        auth = {"Authorization": f"Bearer {token('peer')}"}
        got = await http.get(file_part.url, headers=auth)
        assert got.status_code == 200, (got.text, file_part.url)
        assert got.content == result
        assert got.headers["etag"] == f'"{blob}"'
        assert (await http.get(file_part.url)).status_code == 401
        other = {"Authorization": f"Bearer {token('peer', workspaces=('elsewhere',))}"}
        assert (await http.get(file_part.url, headers=other)).status_code == 403
        unreferenced = await workspaces.store.blobs.put(b"not referenced")
        missing = await http.get(f"/blobs/{WORKSPACE}/{unreferenced}", headers=auth)
        assert missing.status_code == 404


async def test_a_url_part_naming_another_workspaces_blob_opens_nothing(
    service: A2AService, workspaces: Workspaces, token: TokenFactory
) -> None:
    """The attacker knows the hash of a blob of workspace "secret" and sends a file part
    whose URL names it under its own workspace (on any host): no artifact, nothing to read."""
    secret = os.urandom(100_000)
    sha = await workspaces.store.blobs.put(secret)
    await workspaces.store.blobs.grant("secret", sha, len(secret), "owner")
    async with open_client(service.url, token("peer"), streaming=False) as peer:
        message = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            context_id=WORKSPACE,
            parts=[
                Part(text="look"),
                Part(url=f"http://elsewhere.example/blobs/{WORKSPACE}/{sha}", filename="x"),
                Part(url=f"/blobs/{WORKSPACE}/{sha}", filename="y"),
            ],
        )
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        [r async for r in peer.send_message(request)]
    state = await workspaces.state(WORKSPACE)
    assert not {"x", "y"} & set(state.artifacts)
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        auth = {"Authorization": f"Bearer {token('peer')}"}
        got = await http.get(f"/blobs/{WORKSPACE}/{sha}", headers=auth)
        assert got.status_code == 404


async def test_a_small_artifact_goes_out_inline(
    service: A2AService, workspaces: Workspaces, token: TokenFactory
) -> None:
    """At most INLINE_MAX_BYTES: the file part carries the bytes (no second request); one
    byte more: the URL. A URL part an agent wrote into a work product by hand, naming a blob
    its workspace does not reference, is never inlined (it would leak another's content)."""
    from a2a.types.a2a_pb2 import Artifact
    from google.protobuf import json_format

    from a2a_adapter.inline import INLINE_MAX_BYTES
    from hub.core.events import WorkPublished

    secret = await workspaces.store.blobs.put(b"another workspace's secret")
    async with open_client(service.url, token("peer"), streaming=False) as peer:
        message = Message(
            message_id=str(uuid.uuid4()), role=Role.ROLE_USER, context_id=WORKSPACE,
            parts=[Part(text="make two files")],
        )  # fmt: skip
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        replies = [r async for r in peer.send_message(request)]
        task_id = replies[0].task.id
        small, large = os.urandom(INLINE_MAX_BYTES), os.urandom(INLINE_MAX_BYTES + 1)
        drafts: list[Event] = []
        for key, data in (("small.bin", small), ("large.bin", large)):
            blob = await workspaces.store.blobs.put(data)
            await workspaces.store.blobs.grant(WORKSPACE, blob, len(data), "worker")
            drafts.append(
                ArtifactPublished(
                    correlation_id=task_id,
                    payload=ArtifactPayload(key=key, media_type="application/x-bin", blob=blob),
                )
            )
        forged = Artifact(
            artifact_id="forged",
            name="forged",
            parts=[Part(url=f"/blobs/{WORKSPACE}/{secret}", filename="x")],
        )
        drafts.append(
            WorkPublished(correlation_id=task_id, payload=json_format.MessageToDict(forged))
        )
        await workspaces.publish(WORKSPACE, drafts, producer="worker")
        task = await peer.get_task(GetTaskRequest(id=task_id))

    def content(name: str) -> Part:
        (artifact,) = [a for a in task.artifacts if a.name == name]
        (part,) = [p for p in artifact.parts if p.WhichOneof("content") in ("raw", "url")]
        return part

    assert content("small.bin").WhichOneof("content") == "raw"
    assert content("small.bin").raw == small
    assert content("small.bin").filename == "small.bin"
    assert content("large.bin").WhichOneof("content") == "url"
    forged_part = content("forged")
    assert forged_part.WhichOneof("content") == "url", "a blob of no reference was inlined"
