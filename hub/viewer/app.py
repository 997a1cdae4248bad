"""The viewer's HTTP door: the built single-page app at ``/ui/`` and its read-only JSON.

:func:`create_viewer_app` builds a Starlette app that answers every path under ``/ui`` (it is
mounted by path prefix in front of the A2A app, so the A2A ``BearerAuth`` never sees these
paths; until the one HTTP port lands the mount is a few lines in ``a2a_adapter/app.py``):

- ``GET /ui/config.json`` (public): ``{"wsUrl", "version"}`` — where the page's WebSocket
  client connects (the hub's own ``agora.v1`` port);
- ``GET /ui/api/workspaces`` (bearer, ``read``): the workspaces the token may read, each with
  ``head`` and ``lastActivity`` (epoch ms; 0 for a workspace without events);
- ``GET /ui/api/w/{workspace}/verify`` (bearer, ``read``): the store's hash-chain check of the
  workspace (``ok, checked, head, error?``), as ``agora verify`` runs it;
- ``GET /ui/api/w/{workspace}/export[?tail=N]`` (bearer, ``read``): the stored envelopes as JSON
  Lines, byte for byte what ``agora export`` writes (up to the head when the request came;
  with ``tail``, only the last N: the page's catch-up is bounded). An agent runs at most
  ``[viewer] exports_per_agent`` at once (one more: 429); each response is cut (the body left
  incomplete) after ``[viewer] export_deadline_s``; the store is read a page at a time, each
  page under a permit of :data:`MAX_HEAVY`, never held while the client drains;
- ``GET /ui/assets/…``: the hashed bundle files (immutable);
- every other ``GET /ui/…``: ``index.html``, so a deep link (``/ui/w/demo?seq=123``) opens the
  page that then routes on its own.

Everything the page shows beyond these comes over the WebSocket with the same token, so the
hub's rights apply exactly as for any agent. A missing, bad, expired or revoked token is a 401
(``WWW-Authenticate: Bearer``), a workspace the token may not read a 403, a bad name a 400
(every error's status is the error table's, :data:`hub.core.errors.ERROR_TABLE`); nothing
here writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Final

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from hub import __version__
from hub.auth import TokenSigner, bearer_token
from hub.config import ViewerConfig
from hub.core.capability import Capability
from hub.core.chain import GENESIS, ChainBreak, verify_chain
from hub.core.errors import (
    AgoraError,
    BadRequest,
    IntegrityError,
    RateLimited,
    Unauthorized,
    error_row,
)
from hub.core.records import VerifyReport
from hub.core.validation import validate_workspace
from hub.log.base import EventStore
from hub.revocations import Revocations
from hub.viewer.build import STATIC_DIR
from hub.workspaces import Workspaces

__all__ = ["EXPORT_PAGE", "PREFIX", "create_viewer_app"]

PREFIX: Final = "/ui"
EXPORT_PAGE: Final = 1000
"""Events read from the store per page of an export (bounded memory per download)."""

VERIFY_PAGE: Final = 1000
"""Events hashed per step of a verification, in a worker thread (the loop never waits)."""

MAX_HEAVY: Final = 4
"""Store reads of exports (one page each) and verifications (each reads a whole log) running
at once; more wait their turn, so read tokens cannot make the hub read every log at once. An
export holds a permit only while it reads a page, never while its client drains one: slow
readers cannot lock everyone out."""

CSP: Final = (
    "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; script-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)
"""The page loads only its own bundle and talks only to this origin and WebSockets."""

_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _Row(msgspec.Struct, frozen=True, rename="camel"):
    workspace: str
    head: int
    last_activity: int


def create_viewer_app(
    workspaces: Workspaces,
    signer: TokenSigner,
    revocations: Revocations,
    *,
    ws_url: str,
    static_dir: Path = STATIC_DIR,
    settings: ViewerConfig | None = None,
) -> Starlette:
    """The viewer's ASGI app (routes in the module doc). ``ws_url``: the ``agora.v1`` URL the
    page connects to by default; ``static_dir``: the built assets."""
    settings = settings or ViewerConfig()
    verify: Callable[[str], Capability] = revocations.verifier(signer.verify)
    store = workspaces.store

    def capability(request: Request) -> Capability:
        token = bearer_token(request.headers.get("authorization"))
        if token is None:
            raise Unauthorized("an Authorization: Bearer token is required", reason="missing")
        return verify(token)

    def readable(request: Request) -> tuple[Capability, str]:
        cap = capability(request)
        workspace = validate_workspace(str(request.path_params["workspace"]))
        cap.require("read", workspace)
        return cap, workspace

    async def config(_: Request) -> Response:
        return JSONResponse(
            {"wsUrl": ws_url, "version": __version__}, headers={"Cache-Control": "no-cache"}
        )

    async def list_workspaces(request: Request) -> Response:
        cap = capability(request)
        rows = {
            h.workspace: _Row(h.workspace, h.seq, h.timestamp)
            for h in await store.heads()
            if cap.has("read", h.workspace)
        }
        for name in cap.workspaces:  # named in the token but still empty
            if name != "*" and name not in rows and cap.has("read", name):
                rows[name] = _Row(name, 0, 0)
        ordered = sorted(rows.values(), key=lambda r: (-r.last_activity, r.workspace))
        return Response(msgspec.json.encode(ordered), media_type="application/json")

    heavy = asyncio.Semaphore(MAX_HEAVY)

    async def verify_chain(request: Request) -> Response:
        _, workspace = readable(request)
        async with heavy:
            report = await _verify(store, workspace)
        body: dict[str, object] = {
            "workspace": workspace,
            "ok": report.ok,
            "checked": report.checked,
            "head": report.head,
        }
        if report.error is not None:
            body["error"] = msgspec.to_builtins(report.error)
        return JSONResponse(body)

    exporting: dict[str, int] = {}  # agent -> its exports running now

    async def export(request: Request) -> Response:
        cap, workspace = readable(request)
        tail = _tail(request.query_params.get("tail"))
        head = await workspaces.head(workspace)
        agent = cap.agent
        if exporting.get(agent, 0) >= settings.exports_per_agent:
            raise RateLimited(
                f"at most {settings.exports_per_agent} exports of one agent at once",
                limit=settings.exports_per_agent,
            )

        async def pages(after: int) -> AsyncIterator[bytes]:
            while after < head:
                async with heavy:  # only the store read: not while the client drains the page
                    page = await store.read_raw(workspace, after_seq=after, limit=EXPORT_PAGE)
                page = [(seq, raw) for seq, raw in page if seq <= head]
                if not page:
                    return
                yield b"".join(raw + b"\n" for _, raw in page)
                after = page[-1][0]

        def release() -> None:
            exporting[agent] -= 1
            if not exporting[agent]:
                del exporting[agent]

        exporting[agent] = exporting.get(agent, 0) + 1
        return _Bounded(
            pages(0 if tail is None else max(0, head - tail)),
            deadline_s=settings.export_deadline_s,
            release=release,
            media_type="application/x-ndjson",
            headers={"Content-Disposition": f'attachment; filename="{workspace}.jsonl"'},
        )

    async def index(_: Request) -> Response:
        page = static_dir / "index.html"
        if not page.is_file():
            return PlainTextResponse(
                "the viewer is not built: run `npm ci && npm run build` in web/", status_code=503
            )
        return FileResponse(page, headers={**_SECURITY_HEADERS, "Cache-Control": "no-cache"})

    async def to_slash(_: Request) -> Response:
        return RedirectResponse(PREFIX + "/", status_code=308)

    def guarded(
        endpoint: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await endpoint(request)
            except Unauthorized as e:
                return JSONResponse(
                    {"code": e.code, "message": e.message, "details": e.details},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="agora"'},
                )
            except AgoraError as e:  # the status is the error table's (hub.core.errors)
                return JSONResponse(
                    {"code": e.code, "message": e.message, "details": e.details},
                    status_code=error_row(e.code).http,
                )

        return run

    api = PREFIX + "/api"
    routes = [
        Route(PREFIX, to_slash),
        Route(PREFIX + "/config.json", config),
        Route(api + "/workspaces", guarded(list_workspaces)),
        Route(api + "/w/{workspace}/verify", guarded(verify_chain)),
        Route(api + "/w/{workspace}/export", guarded(export)),
        Route(api + "/{rest:path}", _not_found),
        Mount(
            PREFIX + "/assets",
            StaticFiles(directory=static_dir / "assets", check_dir=False),
        ),
        Route(PREFIX + "/{rest:path}", index),
    ]
    return Starlette(routes=routes)


class _Bounded(StreamingResponse):
    """A streamed response with a deadline for the whole of it (the client's reading
    included): past it the body is cut off unfinished (no final chunk: the client sees a
    failed download, never a short file that looks whole). ``release`` runs once it ends."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        deadline_s: float,
        release: Callable[[], None],
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.deadline_s = deadline_s
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with anyio.move_on_after(self.deadline_s):
                await super().__call__(scope, receive, send)
        finally:
            self.release()


async def _verify(store: EventStore, workspace: str) -> VerifyReport:
    """``store.verify`` (the same walk and report), with the hashing of each page in a worker
    thread: the hub's event loop keeps serving while a large log is checked. A stored row
    that does not decode is the break, at its seq, as ``agora verify`` reports it (the
    events before it in its page are checked first), never an ``internal`` error."""
    checked, prev, last = 0, GENESIS, 0
    while True:
        undecodable: ChainBreak | None = None
        try:
            page = await store.read_batch(workspace, after_seq=last, limit=VERIFY_PAGE)
        except IntegrityError as e:
            seq = e.details.get("seq")
            bad = seq if isinstance(seq, int) and seq > last else last + 1
            undecodable = ChainBreak(seq=bad, problem=e.message)
            before = bad - last - 1
            page = await store.read_batch(workspace, after_seq=last, limit=before) if before else []
        n, problem = await asyncio.to_thread(verify_chain, page, after_seq=last, prev=prev)
        checked += n
        if problem is not None:
            head = page[n - 1].seq if n else last
            return VerifyReport(workspace=workspace, checked=checked, head=head, error=problem)
        if page:
            prev, last = page[-1].hash or GENESIS, page[-1].seq
        if undecodable is not None:
            return VerifyReport(workspace=workspace, checked=checked, head=last, error=undecodable)
        if len(page) < VERIFY_PAGE:
            return VerifyReport(workspace=workspace, checked=checked, head=last)


def _tail(text: str | None) -> int | None:
    """``?tail=N``: only the last N events (1 ≤ N ≤ 10^9); absent: all of them."""
    if text is None:
        return None
    if not text.isdigit() or not 1 <= int(text) <= 10**9:
        raise BadRequest("tail must be an integer from 1 to 10^9", field="tail")
    return int(text)


async def _not_found(_: Request) -> Response:
    return JSONResponse({"code": "notFound", "message": "no such endpoint"}, status_code=404)
