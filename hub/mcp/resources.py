"""MCP resources of a workspace: its files and its timeline, and the watchers behind
``resources/subscribe``.

- ``agora://<workspace>/files/<path>``: a file's current content (``text``, or ``blob`` as
  base64 for binary files); the path is percent-encoded per segment.
- ``agora://<workspace>/timeline``: the last :data:`TIMELINE_TAIL` events as JSON, at most
  about :data:`~hub.mcp.tools.MAX_RESULT_BYTES` of them (the newest; ``truncated`` says older
  ones of the tail were left out).

A subscription follows its workspace live through the connection's hub session (one follower
per workspace, shared by every subscribed URI) and sends ``notifications/resources/updated``
for a file URI when a ``fileWritten``/``fileDeleted``/``fileMoved`` touches that path, and for
the timeline URI on every event. A connection holds at most :data:`MAX_SUBSCRIPTIONS`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote, unquote

import msgspec

from hub.core.errors import AgoraError, BadRequest, NotFound, TooLarge
from hub.core.events import Event, FileDeleted, FileMoved, FileWritten
from hub.core.validation import validate_path, validate_workspace
from hub.mcp.tools import MAX_RESULT_BYTES, AgentLink, event_json

__all__ = [
    "FILES_TEMPLATE",
    "MAX_LISTED",
    "MAX_SUBSCRIPTIONS",
    "SCHEME",
    "TIMELINE_TAIL",
    "TIMELINE_TEMPLATE",
    "ResourceRef",
    "Watchers",
    "file_uri",
    "list_resources",
    "parse_uri",
    "read_resource",
    "timeline_uri",
]

log = logging.getLogger(__name__)

SCHEME: Final = "agora"
FILES_TEMPLATE: Final = "agora://{workspace}/files/{+path}"
TIMELINE_TEMPLATE: Final = "agora://{workspace}/timeline"
TIMELINE_TAIL: Final = 100
"""Events a read of the timeline resource returns (the newest ones)."""
MAX_LISTED: Final = 1000
"""Resources one ``resources/list`` names at most (files first, by path)."""
MAX_SUBSCRIPTIONS: Final = 256
"""Resource subscriptions one connection may hold; more are refused ``tooLarge``."""


class ResourceRef(msgspec.Struct, frozen=True):
    """A parsed resource URI: the workspace and the file path (None: the timeline)."""

    workspace: str
    path: str | None


def file_uri(workspace: str, path: str) -> str:
    return f"{SCHEME}://{workspace}/files/" + "/".join(quote(p, safe="") for p in path.split("/"))


def timeline_uri(workspace: str) -> str:
    return f"{SCHEME}://{workspace}/timeline"


def parse_uri(uri: str) -> ResourceRef:
    """Raises ``BadRequest`` (field ``uri``) for anything but the two shapes above."""
    prefix = f"{SCHEME}://"
    if not uri.startswith(prefix):
        raise BadRequest(f"not an {SCHEME}:// resource: {uri[:200]!r}", field="uri")
    workspace, _, rest = uri[len(prefix) :].partition("/")
    try:
        validate_workspace(workspace, field="uri")
    except BadRequest as e:
        raise BadRequest(e.message, field="uri") from None
    if rest == "timeline":
        return ResourceRef(workspace, None)
    if rest.startswith("files/"):
        path = "/".join(unquote(p) for p in rest[len("files/") :].split("/"))
        return ResourceRef(workspace, validate_path(path, field="uri"))
    raise BadRequest(f"unknown resource {uri[:200]!r}", field="uri")


async def list_resources(link: AgentLink) -> list[dict[str, Any]]:
    """The files (and the timeline) of the connection's default workspace; none without."""
    try:
        ws = link.workspace(None)
    except BadRequest:
        return []
    state = await ws.state()
    out: list[dict[str, Any]] = [
        {
            "uri": timeline_uri(ws.name),
            "name": f"{ws.name} timeline",
            "mimeType": "application/json",
        }
    ]
    for path, entry in sorted(state.files.items())[: MAX_LISTED - 1]:
        item: dict[str, Any] = {"uri": file_uri(ws.name, path), "name": path, "size": entry.size}
        if entry.media_type is not None:
            item["mimeType"] = entry.media_type
        out.append(item)
    return out


async def read_resource(link: AgentLink, uri: str) -> dict[str, Any]:
    """``{"uri", "mimeType", "text" | "blob"}``. Raises ``NotFound``, ``Forbidden``, …"""
    ref = parse_uri(uri)
    ws = link.workspace(ref.workspace)
    if ref.path is None:
        head = await ws.head()
        # The newest events within the byte cap: older ones drop off the front as newer ones
        # come, so memory stays at the cap plus one event (events reach ~max_event_bytes).
        events: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        size = 0
        truncated = False
        if head > 0:
            async with ws.subscribe(max(0, head - TIMELINE_TAIL)) as sub:
                async for ev in sub:
                    item = event_json(ev)
                    events.append((n := len(msgspec.json.encode(item)), item))
                    size += n
                    while size > MAX_RESULT_BYTES and len(events) > 1:
                        size -= events.popleft()[0]
                        truncated = True
                    if ev.seq >= head:
                        break
        text = msgspec.json.encode(
            {
                "workspace": ws.name,
                "head": head,
                "events": [item for _, item in events],
                "truncated": truncated,
            }
        )
        return {"uri": uri, "mimeType": "application/json", "text": text.decode()}
    state = await ws.state(contents=True, paths=[ref.path])
    entry = state.files.get(ref.path)
    if entry is None:
        raise NotFound(f"no file {ref.path!r} in workspace {ws.name!r}", path=ref.path)
    out: dict[str, Any] = {"uri": uri}
    if entry.media_type is not None:
        out["mimeType"] = entry.media_type
    if entry.text is not None:
        out.setdefault("mimeType", "text/plain")
        out["text"] = entry.text
    elif entry.base64 is not None:
        out.setdefault("mimeType", "application/octet-stream")
        out["blob"] = entry.base64
    else:
        raise NotFound(
            f"{ref.path!r} is in the blob store ({entry.size} bytes); its content is not inline",
            path=ref.path,
            blob=entry.blob,
        )
    return out


def _touched(ev: Event) -> tuple[str, ...]:
    if isinstance(ev, FileWritten | FileDeleted):
        return (ev.payload.path,)
    if isinstance(ev, FileMoved):
        return (ev.payload.from_, ev.payload.to)
    return ()


Notify = Callable[[str], Awaitable[None]]


class Watchers:
    """The resource subscriptions of one connection (see the module doc). :meth:`aclose`
    ends every follower; it is idempotent."""

    def __init__(self, link: AgentLink, notify: Notify) -> None:
        self.link = link
        self.notify = notify
        self._uris: dict[str, ResourceRef] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def uris(self) -> frozenset[str]:
        return frozenset(self._uris)

    async def subscribe(self, uri: str) -> None:
        """Raises ``BadRequest`` (bad URI), ``Forbidden`` (no read right), ``TooLarge``."""
        ref = parse_uri(uri)
        if uri in self._uris:
            return
        if len(self._uris) >= MAX_SUBSCRIPTIONS:
            raise TooLarge(f"at most {MAX_SUBSCRIPTIONS} subscriptions", limit=MAX_SUBSCRIPTIONS)
        ws = self.link.workspace(ref.workspace)
        if ws.name not in self._tasks:
            sub = ws.subscribe(None)
            await sub.head()  # subscribed (or Forbidden) before the call returns
            self._tasks[ws.name] = asyncio.create_task(self._follow(ws.name, sub))
        self._uris[uri] = ref

    def unsubscribe(self, uri: str) -> None:
        ref = self._uris.pop(uri, None)
        if ref is None or any(r.workspace == ref.workspace for r in self._uris.values()):
            return
        task = self._tasks.pop(ref.workspace, None)
        if task is not None:
            task.cancel()

    async def _follow(self, workspace: str, sub: Any) -> None:
        try:
            async with sub:
                async for ev in sub:
                    touched = _touched(ev)
                    for uri, ref in list(self._uris.items()):
                        if ref.workspace != workspace:
                            continue
                        if ref.path is None or ref.path in touched:
                            await self.notify(uri)
        except asyncio.CancelledError:
            raise
        except AgoraError as e:
            log.info("resource subscription of %r ended: %s", workspace, e.message)
        except Exception:
            log.exception("resource subscription of %r failed", workspace)

    async def aclose(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        self._uris.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
