"""Files across the A2A door (docs/a2a.md, "Files"): blob downloads over HTTP, and the file
parts of incoming messages stored as blobs and published as artifacts.

* :func:`create_blob_app` — ``GET /blobs/{workspace}/{sha256}``: the content of a blob the
  workspace references (a file or an artifact), streamed in 512 KiB ranges (never whole in
  memory), for a bearer token with the read right on that workspace. Anything else is 404
  (whether the blob exists elsewhere is not told), 403 without the right. It runs behind the
  listener's :class:`~a2a_adapter.auth.BearerAuth` (which sets the capability in the scope)
  and checks the capability itself too, so it stays safe wherever it is mounted.
* :func:`intake_file_parts` — every part of an incoming message that carries bytes (``raw``)
  is stored as a blob, published as ``artifactPublished`` (key: the part's filename, else
  ``a2a/<messageId>/<index>``), and replaced in the message by a ``url`` part pointing at
  its download path, so the log never holds the bytes twice. A ``url`` part naming this
  hub's own ``/blobs/...`` path is published as an artifact of that blob; other URLs are left
  as they are (the hub fetches nothing from the network).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Final

from a2a.types.a2a_pb2 import Message
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from a2a_adapter.auth import SCOPE_KEY
from a2a_adapter.mapping import BLOBS_PATH, blob_path
from hub.core.capability import Capability
from hub.core.errors import AgoraError, Forbidden
from hub.core.events import ArtifactPayload, ArtifactPublished, Event
from hub.core.validation import SHA256_RE, validate_workspace
from hub.workspaces import Workspaces

__all__ = ["BLOBS_PATH", "blob_path", "create_blob_app", "intake_file_parts"]

READ_CHUNK: Final = 512 * 1024
_OWN_URL: Final = re.compile(r"^(?:https?://[^/]+)?/blobs/([^/]+)/([0-9a-f]{64})$")


def create_blob_app(workspaces: Workspaces) -> Starlette:
    """The blob download door (see the module docstring); mount it at :data:`BLOBS_PATH`."""

    async def download(request: Request) -> Response:
        capability = request.scope.get(SCOPE_KEY)
        if not isinstance(capability, Capability):
            return PlainTextResponse("a bearer token is required\n", status_code=401)
        workspace = request.path_params["workspace"]
        sha = request.path_params["sha256"]
        try:
            validate_workspace(workspace)
            capability.require("read", workspace)
        except Forbidden:
            return PlainTextResponse("no read right on this workspace\n", status_code=403)
        except AgoraError:
            return PlainTextResponse("not found\n", status_code=404)
        if not SHA256_RE.fullmatch(sha) or not await workspaces.references_blob(workspace, sha):
            return PlainTextResponse("not found\n", status_code=404)
        blobs = workspaces.store.blobs
        size = await blobs.size(sha)

        async def body() -> AsyncIterator[bytes]:
            offset = 0
            while offset < size:
                part = await blobs.read(sha, offset, READ_CHUNK)
                if not part:
                    return
                offset += len(part)
                yield part

        headers = {
            "Content-Length": str(size),
            "ETag": f'"{sha}"',
            "Cache-Control": "private, max-age=31536000, immutable",  # content-addressed
        }
        return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)

    return Starlette(routes=[Route("/{workspace}/{sha256}", download, methods=["GET"])])


async def intake_file_parts(
    workspaces: Workspaces, workspace: str, message: Message
) -> list[Event]:
    """Store the message's byte parts as blobs (the message is changed in place: each becomes
    a ``url`` part to its download path); return the ``artifactPublished`` drafts for them
    and for parts naming blobs of this hub. Raises what the blob store raises."""
    drafts: list[Event] = []
    for i, part in enumerate(message.parts):
        content = part.WhichOneof("content")
        key = part.filename or f"a2a/{message.message_id}/{i}"
        media = part.media_type or "application/octet-stream"
        if content == "raw":
            sha = await workspaces.store.blobs.put(part.raw)
            part.url = blob_path(workspace, sha)  # replaces raw (one content per part)
        elif content == "url":
            match = _OWN_URL.fullmatch(part.url)
            if match is None or match.group(1) != workspace:
                continue
            sha = match.group(2)
            if not await workspaces.store.blobs.has(sha):
                continue
        else:
            continue
        drafts.append(
            ArtifactPublished(payload=ArtifactPayload(key=key, media_type=media, blob=sha))
        )
    return drafts
