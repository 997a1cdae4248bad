"""One worker of ``agora serve --workers N``: its role, its internal socket, and forwarding
(which ``[cluster] owners`` also uses between nodes: :class:`NodePlacement`).

Every workspace has one owner among the workers (:func:`hub.core.sharding.owner_of`); the
kernel spreads client connections over the workers (``SO_REUSEPORT``), so a connection often
reaches a worker that does not own the workspace a frame names. That worker then relays the
frame, verbatim, to the owner over an *upstream* connection — the same WebSocket protocol, on
the owner's internal unix socket (:func:`internal_socket`, mode 0600 under the data
directory), authenticated with the client's own token — and relays what the owner answers
(acks with their ``rid``, events, errors) back into the client's own send queue. Hence every
subscriber of a workspace is on its owner: live delivery, presence and claims are decided by
one process, and the order, resume and limits are the owner's, as if the client were on it.

:class:`Forwarder` is that relay for one client connection: at most one upstream per other
worker, opened at the first frame for one of its workspaces (an owner that is not listening,
a worker restarting, is waited for: :data:`OWNER_WAIT`), closed with the client connection
(and an upstream the owner closes closes the client connection with the same code and reason,
queued behind what the owner sent before it: a ``4408`` reason still names the last seq the
client gets). Frames that name no workspace (``hello``) are answered locally; a
refreshing ``hello`` also goes to every upstream (their ``welcome`` is dropped), so the token
each upstream acts with is the client's current one.

Where the owner is and how it is reached is a :class:`Placement`: :class:`WorkerPlacement`
(the workers' unix sockets), or :class:`NodePlacement` (``[cluster] owners``: the owner among
the live nodes by rendezvous hashing, reached at its URL with :data:`RELAY_HEADER`;
docs/architecture.md, "Owners across nodes").

Back-pressure: the relay puts each frame of the owner into the client's queue ``paced`` (it
waits for room), and stops reading the upstream meanwhile; the owner then sees a slow reader
and applies its own ``send_queue`` limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import msgspec
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.protocol import State
from websockets.typing import Subprotocol

from hub.core.backoff import Backoff
from hub.core.decoding import json_too_deep
from hub.core.errors import CloseCode
from hub.core.sharding import node_owner_of, owner_of
from hub.core.wire.frames import SUBPROTOCOL
from hub.core.wire.session import Close
from hub.server.fanout import NOT_AN_EVENT

if TYPE_CHECKING:
    from hub.server.connection import Connection

__all__ = [
    "METRICS_PATH",
    "RELAY_HEADER",
    "Forwarder",
    "NodePlacement",
    "Placement",
    "WorkerPlacement",
    "WorkerRole",
    "fetch_metrics",
    "internal_socket",
]

log = logging.getLogger("agora.server")

SOCKET_DIR: Final = "workers"
"""Under the data directory: the workers' internal sockets (``<index>.sock``) and, on SQLite,
the supervisor's ``writer.sock`` (:func:`writer_socket`)."""

OWNERS_CACHED: Final = 65536
"""Workspace names whose owner a worker keeps computed (then it starts again)."""

UNIX_PATH_MAX: Final = 107
"""The longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""

_WELCOME: Final = b'"welcome"'
"""In every ``welcome`` (a cheap test before decoding the frame's ``op``): an upstream's
welcomes answer the hellos the relay sent, not the client's, and are dropped."""

OWNER_WAIT: Final = Backoff(initial=0.05, maximum=0.5, give_up_after=10.0)
"""How long, and how often, a relay tries again to reach an owner whose socket refuses (a
worker restarting: the supervisor first closes what it left open, then starts it after its
backoff) before closing the client connection with :data:`OWNER_GONE`. Waiting here, rather
than closing at once, keeps clients from burning their reconnect attempts on a restart."""

OWNER_GONE: Final = CloseCode.TRY_AGAIN
"""The close a client gets when the owner of a workspace it uses cannot be reached or went
away without a close frame (a worker restarting): 1013, try again later (and resume)."""


METRICS_PATH: Final = "/metrics"
"""On a worker's internal socket, a plain HTTP ``GET`` of it answers the worker's own metrics
(text format): worker 0's ``/metrics`` gathers every worker's (:func:`fetch_metrics`)."""
METRICS_TIMEOUT_S: Final = 2.0
"""How long worker 0 waits for another worker's metrics before leaving it out of a scrape."""
_MAX_METRICS_BYTES: Final = 16 * 1024 * 1024
_METRICS_REQUEST: Final = (
    f"GET {METRICS_PATH} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
)


class WorkerRole(msgspec.Struct, frozen=True, kw_only=True):
    """This process is worker ``index`` of ``count``; internal sockets live in ``socket_dir``.
    ``node``: the node id the supervisor named this start of the worker (on SQLite, so that it
    can close what the worker leaves open if it dies: :mod:`hub.server.reaper`); None: the
    hub's own (on PostgreSQL the cluster reaps a dead worker like any node)."""

    index: int
    count: int
    socket_dir: Path
    node: str | None = None

    def owns(self, workspace: str) -> bool:
        return owner_of(workspace, self.count) == self.index

    def socket(self, index: int) -> Path:
        return internal_socket(self.socket_dir, index)


def internal_socket(socket_dir: Path, index: int) -> Path:
    """The internal socket of worker ``index`` (checked against the unix path limit by the
    supervisor before any worker starts)."""
    return socket_dir / f"{index}.sock"


def writer_socket(socket_dir: Path) -> Path:
    """Where the supervisor serves the SQLite file's writes to the workers
    (:mod:`hub.log.handoff`)."""
    return socket_dir / "writer.sock"


async def fetch_metrics(path: Path) -> bytes | None:
    """The metrics of the worker whose internal socket is ``path`` (``GET``
    :data:`METRICS_PATH` over it, HTTP/1.1); None when it does not answer within
    :data:`METRICS_TIMEOUT_S` or answers anything but 200 (a worker restarting: the scrape
    goes on without it)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(METRICS_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_METRICS_REQUEST)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status, *lines = head.decode("latin-1").split("\r\n")
            if status.split(" ", 2)[1:2] != ["200"]:
                log.warning("worker metrics at %s: %s", path, status)
                return None
            length = None
            for line in lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length is None or length > _MAX_METRICS_BYTES:
                log.warning("worker metrics at %s: no usable Content-Length", path)
                return None
            return await reader.readexactly(length)
    except (OSError, TimeoutError, ValueError, EOFError, asyncio.LimitOverrunError) as e:
        log.warning("worker metrics at %s unavailable: %r", path, e)
        return None
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _Route(msgspec.Struct):
    """The two fields a frame is routed by; the rest is skipped, not decoded."""

    op: str | None = None
    workspace: str | None = None


_route = msgspec.json.Decoder(_Route)


def _is_welcome(data: bytes) -> bool:
    try:
        return _route.decode(data).op == "welcome"
    except msgspec.MsgspecError:
        return False


RELAY_HEADER: Final = "Agora-Relay"
"""Sent by a node relaying a client's frames to the node that owns a workspace: its id and a
proof only a node can make (:meth:`hub.auth.TokenSigner.relay_header`). The owner serves that
connection itself, never relaying it on (two nodes whose views of the live nodes differ for a
moment cannot pass frames back and forth). A header without a valid proof (a client's) is
ignored: that connection is relayed like any other."""

PLACEMENTS_MAX: Final = 4
"""How many times one frame is placed anew when its owner changes while its upstream opens
(the live nodes changing under it); then the client connection closes with 1013."""

PLACED_MAX: Final = 4096
"""The most workspaces one connection's placements are remembered for (the oldest forgotten
first): a bound on what a client can make the relay keep."""

_UNPLACED: Final = object()


class OwnerMoved(Exception):
    """The owner named for a workspace changed while its upstream was being opened."""


class Placement(Protocol):
    """Who decides a workspace's frames: this process (None) or another, named by a key
    (a worker's index, a node's id), and how to reach it."""

    def owner(self, workspace: str) -> str | None: ...

    async def connect(
        self, owner: str, headers: Mapping[str, str], wanted: Callable[[], bool]
    ) -> ClientConnection:
        """An open upstream to ``owner``, trying again while it refuses and ``wanted()``;
        raises :class:`OwnerMoved` once ``wanted()`` is false, or what the connect raises."""
        ...


class WorkerPlacement:
    """``agora serve --workers N``: the owner is :func:`owner_of` the name, reached over its
    internal unix socket (waited for under :data:`OWNER_WAIT` while it restarts)."""

    def __init__(self, role: WorkerRole) -> None:
        self.role = role
        # Asked for every frame of every connection: each name hashed once (bounded).
        self._owners: dict[str, str | None] = {}

    def owner(self, workspace: str) -> str | None:
        owners = self._owners
        try:
            return owners[workspace]
        except KeyError:
            pass
        index = owner_of(workspace, self.role.count)
        owner = None if index == self.role.index else str(index)
        if len(owners) >= OWNERS_CACHED:
            owners.clear()
        owners[workspace] = owner
        return owner

    async def connect(
        self, owner: str, headers: Mapping[str, str], wanted: Callable[[], bool]
    ) -> ClientConnection:
        began = time.monotonic()
        attempt = 0
        while True:
            try:
                return await unix_connect(
                    str(self.role.socket(int(owner))),
                    uri="ws://localhost/",
                    additional_headers=dict(headers),
                    subprotocols=[Subprotocol(SUBPROTOCOL)],
                    max_size=None,  # the owner bounds its frames; this is not a client
                    compression=None,
                    ping_interval=None,  # a local socket: no keepalive needed
                )
            except (FileNotFoundError, ConnectionRefusedError):
                limit = OWNER_WAIT.give_up_after or 0.0
                if time.monotonic() - began >= limit or not wanted():
                    raise
                if attempt == 0:
                    log.info("worker %s not listening; waiting for it", owner)
                await asyncio.sleep(OWNER_WAIT.delay(attempt))
                attempt += 1


class NodePlacement:
    """``[cluster] owners``: the owner is :func:`node_owner_of` the live nodes (the heartbeat's
    view, refreshed every interval: :meth:`update`), reached at its URL with
    :data:`RELAY_HEADER`. With no view yet, or none but this node, every workspace is served
    here. An owner that refuses (it died: it leaves the view after the node timeout) is
    tried again while it is still the owner, for up to ``hold_s`` (the node timeout and two
    heartbeats), then the frame is placed anew (or, past ``hold_s``, the client connection
    closes with :data:`OWNER_GONE`)."""

    def __init__(
        self, node_id: str, relay_header: str, *, hold_s: float, open_timeout: float = 10.0
    ) -> None:
        self.node_id = node_id
        self.relay_header = relay_header  # this node's RELAY_HEADER value
        self.hold_s = hold_s  # the longest a frame waits for an owner that refuses
        self.open_timeout = open_timeout
        self.live: dict[str, str] = {}  # node id -> url

    def update(self, live: Mapping[str, str]) -> None:
        if dict(live) != self.live:
            log.info("owners: live nodes %s", ", ".join(sorted(live)) or "none")
        self.live = dict(live)

    def owner(self, workspace: str) -> str | None:
        owner = node_owner_of(workspace, self.live)
        return None if owner is None or owner == self.node_id else owner

    async def connect(
        self, owner: str, headers: Mapping[str, str], wanted: Callable[[], bool]
    ) -> ClientConnection:
        began = time.monotonic()
        attempt = 0
        while True:
            url = self.live.get(owner)
            if url is None or not wanted():
                raise OwnerMoved(owner)
            try:
                return await connect(
                    url,
                    additional_headers={**headers, RELAY_HEADER: self.relay_header},
                    subprotocols=[Subprotocol(SUBPROTOCOL)],
                    max_size=None,  # the owner bounds its frames; this is not a client
                    compression=None,
                    open_timeout=self.open_timeout,
                    proxy=None,  # node to node, with the client's token: never via a proxy
                )
            # Refused, reset, cut mid-handshake, 503 while it stops: a node going away.
            except (OSError, TimeoutError, InvalidHandshake):
                if time.monotonic() - began >= self.hold_s:
                    raise
                if attempt == 0:
                    log.info("owner node %s at %s unreachable; waiting for it", owner, url)
                await asyncio.sleep(OWNER_WAIT.delay(attempt))
                attempt += 1


class Forwarder:
    """The relay of one client connection to the owners of its workspaces (module doc)."""

    def __init__(self, connection: Connection, placement: Placement, max_depth: int) -> None:
        self.connection = connection
        self.placement = placement
        self.max_depth = max_depth
        self.upstreams: dict[str, ClientConnection] = {}
        self._hello: str | bytes | None = None  # the client's last hello (its token)
        self._opening: dict[str, asyncio.Lock] = {}
        self._gone = False  # an owner was unreachable: the connection is closing (1013)
        # Where each workspace's frames went (None: handled here): a workspace stays where it
        # was placed for the connection's life; when its owner moves, the connection closes.
        self._placed: dict[str, str | None] = {}

    async def route(self, data: str | bytes) -> bool:
        """Relay ``data`` (one text frame of the client) when another worker owns its
        workspace; True when relayed. False: the connection handles it (including every
        frame that does not decode here; the session then answers it as it would)."""
        if json_too_deep(data, self.max_depth):
            return False
        try:
            route = _route.decode(data)
        except msgspec.MsgspecError:
            return False
        if route.workspace is None:
            if route.op == "hello":
                self._hello = data
                for other in list(self.upstreams.values()):
                    with contextlib.suppress(ConnectionClosed):
                        await other.send(data)
            return False
        if not self.connection.authenticated:
            return False
        workspace = route.workspace
        for _ in range(PLACEMENTS_MAX):
            if self._gone:
                return True  # (dropped: the close is queued)
            owner = self.placement.owner(workspace)
            placed = self._placed.get(workspace, _UNPLACED)
            if placed is not _UNPLACED and placed != owner:
                # The owner moved while this connection uses the workspace: its subscription,
                # presence and publishes in flight are where it was placed. Closed, the client
                # resumes on the new owner (by seq, publishes retried by id).
                self._close("workspace owner moved")
                return True
            if owner is None:
                self._place(workspace, None)
                return False
            upstream: ClientConnection | None = self.upstreams.get(owner)
            if upstream is None:
                try:
                    upstream = await self._open(owner, workspace)
                except OwnerMoved:
                    if self.connection.ws.state is not State.OPEN:
                        return True  # the client went away while its frame was held
                    continue  # placed anew (it may be this process now)
                if upstream is None:
                    return True  # the connection is closing (1013, see _open)
            self._place(workspace, owner)
            # Closed: the pump closes the client connection with what the owner said.
            with contextlib.suppress(ConnectionClosed):
                await upstream.send(data)
            return True
        self._close("workspace owner keeps moving")  # (the view changed under every try)
        return True

    def _place(self, workspace: str, owner: str | None) -> None:
        placed = self._placed
        if workspace not in placed and len(placed) >= PLACED_MAX:
            del placed[next(iter(placed))]  # the oldest: bounded, whatever a client sends
        placed[workspace] = owner

    def _close(self, reason: str) -> None:
        self._gone = True
        self.connection.queue.push(Close(int(OWNER_GONE), reason))

    async def _open(self, owner: str, workspace: str) -> ClientConnection | None:
        """The upstream to ``owner``, opened; None when it cannot be reached (the client
        connection is then closing with :data:`OWNER_GONE`). Raises :class:`OwnerMoved` when
        ``workspace`` has another owner meanwhile."""
        lock = self._opening.setdefault(owner, asyncio.Lock())
        async with lock:
            if owner in self.upstreams:
                return self.upstreams[owner]
            headers = {}
            authorization = self.connection.authorization
            if authorization is not None:
                headers["Authorization"] = authorization
            placement, ws = self.placement, self.connection.ws

            def wanted() -> bool:
                return ws.state is State.OPEN and placement.owner(workspace) == owner

            try:
                upstream = await placement.connect(owner, headers, wanted)
                if authorization is None and self._hello is not None:
                    await upstream.send(self._hello)
            except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed, TimeoutError) as e:
                log.warning("owner %s unreachable: %s", owner, e)
                self._close("workspace owner unavailable")
                return None
            self.upstreams[owner] = upstream
            if self.connection.spawn_task(self._pump(owner, upstream), f"upstream:{owner}") is None:
                await upstream.close()
                return None
            return upstream

    async def _pump(self, owner: str, upstream: ClientConnection) -> None:
        """The owner's frames into the client's queue, until either side closes."""
        connection = self.connection
        try:
            while True:
                data = await upstream.recv(decode=False)
                if _WELCOME in data and _is_welcome(data):
                    continue
                if not await connection.relay((data, None, NOT_AN_EVENT)):
                    return
        except ConnectionClosed:
            received = upstream.protocol.close_rcvd
            if received is not None and received.code != 1000:
                code, reason = received.code, received.reason
            else:
                code, reason = int(OWNER_GONE), "workspace owner went away"
            connection.queue.push(Close(code, reason))
        finally:
            self.upstreams.pop(owner, None)

    async def aclose(self) -> None:
        """Close every upstream (the client connection ended), all at once: an owner that
        does not answer the close delays the end by one ``close_timeout``, not one each."""
        upstreams, self.upstreams = list(self.upstreams.values()), {}
        await asyncio.gather(*(upstream.close() for upstream in upstreams), return_exceptions=True)
