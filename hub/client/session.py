"""The session: one connection to a hub at a time, reconnecting and resuming (``agora.v1``,
docs/protocol.md).

::

    async with connect("ws://127.0.0.1:8765", token) as session:
        ws = session.workspace("demo")
        item = await ws.request_work("parser", {"spec": "…"})
        reply = await ws.wait_for_kind(item.correlation_id, "workPublished", timeout=60)

The protocol state (rids, the requests awaiting replies, the resume cursor of each followed
workspace, what a frame means, which closes are fatal) is the pure
:class:`~hub.core.wire.client.ClientProtocol`; this module is its asyncio shell: it feeds the
protocol every frame read and writes what it returns.

- **Nothing is lost silently.** After a dropped connection or a ``4408`` (too slow) close the
  session reconnects with :class:`~hub.core.backoff.Backoff` (exponential, with jitter) and
  every followed workspace resubscribes from its resume cursor (:mod:`hub.client.feed`), so
  subscribers see every event once, in order.
- **Retries are idempotent.** Requests in flight when a connection drops are sent again on the
  next one (publishes carry client-minted ids: the hub answers a repeat as ``duplicate``);
  an ``exec`` is never sent twice.
- **Typed errors.** ``error`` frames become :mod:`hub.core.errors` classes in one place
  (:func:`~hub.client.errors.error_from_frame`); close codes that must not be retried (4401,
  1008, 1009) become :class:`~hub.core.errors.Unauthorized`,
  :class:`~hub.core.errors.BadRequest` and :class:`~hub.core.errors.TooLarge`; so does a
  frame over the client's own ``max_frame_bytes`` (1009 from the client's side: the same
  frame would come again on every reconnect). A close that repeats
  :data:`MAX_IDENTICAL_CLOSES` times in a row with nothing delivered in between fails the
  session too: no silent endless reconnect.

One task per session owns the connection: it reads frames, hands them to the protocol and
routes what comes back (replies by ``rid``, events by workspace), and reconnects; a second task
per connection writes the outgoing frames in order. Both are created by the session and ended
by :meth:`Session.aclose` (idempotent, shielded from cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.typing import Subprotocol

from hub.client.errors import SessionClosed
from hub.client.exec import RidStream
from hub.client.feed import UnsubscribeSent, WorkspaceFeed
from hub.client.verify import CheckpointVerifier, verifier_key
from hub.client.workspace import Workspace
from hub.core.backoff import Backoff
from hub.core.checkpoint import NoteError, NoteVerifier
from hub.core.errors import (
    AgoraError,
    BadRequest,
    Busy,
    CloseCode,
    Internal,
    RateLimited,
    Unavailable,
)
from hub.core.wire import frames
from hub.core.wire.client import (
    ClientProtocol,
    Dropped,
    EventIn,
    Garbled,
    Notice,
    Refused,
    Reply,
    close_error,
    decode_frame,
    encode_frame,
    error_from_frame,
)

__all__ = [
    "DEFAULT_HISTORY",
    "DEFAULT_HISTORY_BYTES",
    "DEFAULT_MAX_FRAME",
    "Session",
    "connect",
]

log = logging.getLogger(__name__)

DEFAULT_HISTORY: Final = 4096
"""Recent events a session keeps per followed workspace for its subscribers and waiters."""

DEFAULT_HISTORY_BYTES: Final = 32 * 1024 * 1024
"""... and at most this many bytes of them (as received)."""

DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024
"""Largest frame the client accepts (``state`` frames with ``contents`` carry file text)."""

MAX_IDENTICAL_CLOSES: Final = 5
"""Connections in a row that may end with the same close code and reason, with no event
delivered in between, before the session fails with that error instead of reconnecting again
(the hub refuses something every time: reconnecting cannot help)."""


class _Pending:
    """A request sent again on every new connection until answered (``publish`` with ids,
    ``state``, ``hello``)."""

    __slots__ = ("data", "future")

    def __init__(self, data: bytes, future: asyncio.Future[frames.ServerFrame]) -> None:
        self.data = data
        self.future = future


_Handler = _Pending | RidStream | WorkspaceFeed | UnsubscribeSent
"""What the session registers with its protocol for a rid."""


STAY_CLOSES: Final = frozenset({1000, int(CloseCode.TOO_SLOW)})
"""Closes after which a session given several nodes reconnects to the same node (a normal
close, or this client reading too slowly); after any other (1001 going away, 1006 cut off,
1011, 1013 try again, …) it tries the next node first."""


class Session:
    """A connection to one hub, reconnecting as needed. Build it with :func:`connect`.

    After :meth:`open` (or ``async with``), ``agent``, ``rights`` and ``server`` hold what the
    hub's ``welcome`` said.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        token: str,
        *,
        reconnect: bool = True,
        backoff: Backoff | None = None,
        history: int = DEFAULT_HISTORY,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        retry_rate_limited: bool = True,
        open_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME,
        compression: str | None = None,
        verify: bool = False,
        checkpoint_key: str | NoteVerifier | None = None,
        witness_file: str | Path | None = None,
        max_identical_closes: int = MAX_IDENTICAL_CLOSES,
    ) -> None:
        self.urls: tuple[str, ...] = (url,) if isinstance(url, str) else tuple(url)
        """The hub nodes this session may use, in order of preference (see :func:`connect`)."""
        if not self.urls or not all(isinstance(u, str) and u for u in self.urls):
            raise BadRequest("url: a hub URL, or a non-empty list of them", field="url")
        self._at = 0  # index in urls of the node in use (or tried next)
        self.agent = ""
        self.rights: tuple[str, ...] = ()
        self.server = ""
        self.history = max(1, history)
        self.history_bytes = max(1, history_bytes)
        self.retry_rate_limited = retry_rate_limited
        self._token = token
        self._reconnect = reconnect
        self._backoff = backoff or Backoff()
        self._open_timeout = open_timeout
        self._max_frame = max_frame_bytes
        self._compression = compression
        self._ws: ClientConnection | None = None  # set while attached (ready to send)
        self._current: ClientConnection | None = None  # the last connection served
        # rids, the requests awaiting replies and the feeds' resume cursors.
        self._protocol: ClientProtocol[_Handler] = ClientProtocol()
        self._feeds: dict[str, WorkspaceFeed] = {}
        self._workspaces: dict[str, Workspace] = {}
        self._outbox: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._failure: AgoraError | None = None
        self._reconnects = 0
        self._max_identical_closes = max(1, max_identical_closes)
        self._delivered = 0  # events handed to feeds: progress between two closes
        self.last_close: tuple[int | None, str] | None = None
        """The close code and reason of the last connection that ended (None: none did)."""
        self.verifier: CheckpointVerifier | None = None
        """Checks every checkpoint the hub shows (``verify=True``; :mod:`hub.client.verify`)."""
        if verify:
            if checkpoint_key is None:
                raise BadRequest("verify=True needs checkpoint_key (the hub's public key)")
            try:
                key = verifier_key(checkpoint_key)
            except NoteError as e:
                raise BadRequest(f"checkpoint_key: {e.message}", field="checkpoint_key") from e
            path = Path(witness_file) if witness_file is not None else None
            self.verifier = CheckpointVerifier(key, path)
        elif witness_file is not None or checkpoint_key is not None:
            raise BadRequest("checkpoint_key and witness_file are for verify=True")

    @property
    def url(self) -> str:
        """The URL of the node in use (or the one to be tried next)."""
        return self.urls[self._at]

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Connect and authenticate. Raises :class:`~hub.core.errors.Unauthorized` (bad or expired
        token), :class:`~hub.core.errors.Unavailable` (the hub cannot be reached) or the error the
        hub
        answered ``hello`` with."""
        if self._task is not None or self._closing is not None:
            raise BadRequest("a session can be opened once")
        ws = await self._first_handshake()
        self._task = asyncio.create_task(self._run(ws), name=f"agora-session {self.url}")

    async def _first_handshake(self) -> ClientConnection:
        """Open on the first node of :attr:`urls` that answers; the last ``Unavailable`` when
        none does. Any other refusal (a bad token) is the answer of every node: raised at once."""
        for at in range(len(self.urls)):
            self._at = at
            try:
                return await self._handshake()
            except Unavailable:
                if at == len(self.urls) - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover (urls is never empty)

    async def aclose(self) -> None:
        """Close the connection and end every subscription and pending call. Idempotent; the
        close completes even if the caller is cancelled."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        self._ws = None
        if self._current is not None:
            await self._current.close()
        self._fail(SessionClosed("the session is closed"), clean=True)

    @property
    def closed(self) -> bool:
        """Whether the session was closed or failed for good."""
        return self._closing is not None or self._failure is not None

    @property
    def reconnects(self) -> int:
        """How many times the session reconnected."""
        return self._reconnects

    async def refresh(self, token: str) -> None:
        """Replace the session's token (before it expires) with a fresh one for the same agent;
        reconnects use it too. Raises :class:`~hub.core.errors.Forbidden` (another agent, or the
        new token lacks the read right on a followed workspace: the old token stays in force)
        or :class:`~hub.core.errors.Unauthorized` (an invalid token: the session ends)."""
        reply = await self.request(frames.Hello(token=token))
        if not isinstance(reply, frames.Welcome):
            raise Internal(f"unexpected reply to hello: {type(reply).__name__}")
        self._token = token
        self.rights = tuple(reply.rights)

    def workspace(self, name: str) -> Workspace:
        """A handle on workspace ``name`` (cheap; the same object for the same name)."""
        ws = self._workspaces.get(name)
        if ws is None:
            ws = self._workspaces[name] = Workspace(self, name)
        return ws

    # -- connection ------------------------------------------------------------------------

    async def _handshake(self) -> ClientConnection:
        """Open a WebSocket and exchange ``hello``/``welcome``. Raises ``Unauthorized``,
        ``Unavailable`` or the error the hub sent."""
        try:
            ws = await ws_connect(
                self.url,
                subprotocols=[Subprotocol(frames.SUBPROTOCOL)],
                compression=self._compression,
                max_size=self._max_frame,
                open_timeout=self._open_timeout,
                proxy=None,
            )
        except InvalidURI as e:
            raise BadRequest(f"invalid hub URL {self.url!r}: {e}", field="url") from e
        except (OSError, TimeoutError, InvalidHandshake) as e:
            raise Unavailable(f"cannot connect to {self.url}: {e}", url=self.url) from e
        try:
            async with asyncio.timeout(self._open_timeout):
                await ws.send(encode_frame(frames.Hello(token=self._token), 0), text=True)
                while True:
                    frame = decode_frame(await ws.recv())
                    match frame:
                        case frames.Welcome():
                            self.agent = frame.agent
                            self.rights = tuple(frame.rights)
                            self.server = frame.server
                            return ws
                        case frames.Error():
                            raise error_from_frame(frame)
                        case _:
                            pass  # nothing else may come before welcome; ignore it
        except ConnectionClosed as e:
            await ws.close()
            code = e.rcvd.code if e.rcvd is not None else None
            reason = e.rcvd.reason if e.rcvd is not None else ""
            raise close_error(code, reason) or Unavailable(
                f"the hub closed the connection during hello ({code})", url=self.url
            ) from e
        except TimeoutError as e:
            await ws.close()
            raise Unavailable(f"no welcome from {self.url} in time", url=self.url) from e
        except BaseException:  # Internal for a bad frame (decode_frame), the hub's error, …
            await ws.close()
            raise

    async def _run(self, ws: ClientConnection) -> None:
        """The session's task: serve one connection after another until a fatal close."""
        repeats = 0
        try:
            while True:
                delivered = self._delivered
                code, reason = await self._serve(ws)
                same = self.last_close == (code, reason) and self._delivered == delivered
                repeats = repeats + 1 if same and code != CloseCode.SHUTDOWN else 1
                self.last_close = code, reason
                fatal = self._failure or close_error(code, reason)
                if fatal is None and repeats >= self._max_identical_closes:
                    fatal = Unavailable(
                        f"the hub closed {repeats} connections in a row the same way "
                        f"({code}: {reason or 'no reason'}) with nothing delivered; giving up",
                        closeCode=code,
                        repeats=repeats,
                    )
                if fatal is not None:
                    raise fatal
                if not self._reconnect:
                    raise Unavailable(
                        f"the hub closed the connection ({code}: {reason or 'no reason'})",
                        closeCode=code,
                    )
                if code == CloseCode.TOO_SLOW:
                    log.info("cut as too slow (4408, last sent %s); resuming", reason or "?")
                else:
                    log.info("connection closed (%s %s); reconnecting", code, reason)
                if len(self.urls) > 1 and code not in STAY_CLOSES:
                    # The node's own trouble (going away, cut off, "try again"): the next
                    # node first. A node that answers and then closes (it cannot reach a
                    # workspace's owner) would otherwise be retried until giving up.
                    self._at = (self._at + 1) % len(self.urls)
                ws = await self._reconnect_loop()
                self._reconnects += 1
        except asyncio.CancelledError:
            raise
        except AgoraError as e:
            self._fail(e)
        except Exception as e:  # a bug: fail the session loudly rather than hang callers
            log.exception("agora session failed")
            self._fail(Internal(f"client failure: {e!r}"))

    async def _reconnect_loop(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        started = loop.time()
        limit = self._backoff.give_up_after
        last: BaseException | None = None
        attempt = 0
        while True:
            delay = self._backoff.delay(attempt)
            attempt += 1
            if limit is not None and loop.time() - started + delay > limit:
                raise Unavailable(
                    f"could not reconnect to {self.url} in {limit:g} s: {last}", url=self.url
                ) from last
            await asyncio.sleep(delay)
            try:
                return await self._handshake()
            except (Unavailable, Internal, RateLimited, Busy) as e:
                last = e
                log.debug("reconnect attempt %d to %s failed: %s", attempt, self.url, e)
                # Fail over: the next attempt goes to the next node (round robin). Feeds
                # resume by seq, which every node sharing the store agrees on: no gap, no
                # duplicate (docs/operations.md, "A node dies").
                self._at = (self._at + 1) % len(self.urls)

    async def _serve(self, ws: ClientConnection) -> tuple[int | None, str]:
        """Attach ``ws``, read it until it closes; return the close code and reason."""
        self._current = ws
        self._attach(ws)
        writer = asyncio.create_task(self._write(ws), name="agora-session writer")
        try:
            async for raw in ws:
                self._dispatch(raw)
                # websockets hands over buffered frames without suspending: without this a
                # burst (a catch-up) runs through a feed's window before its readers get to
                # run, every reader rewinds, and each rewind's unsubscribe/subscribe appends
                # presence events that lengthen the next catch-up (a livelock under load).
                await asyncio.sleep(0)
        except ConnectionClosed:
            pass
        finally:
            self._detach()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        await ws.close()
        protocol = ws.protocol
        sent = protocol.close_sent
        if protocol.close_rcvd is None and sent is not None and sent.code == CloseCode.TOO_BIG:
            # This client failed the connection: a frame over its own max_frame_bytes. The
            # hub would send the same frame again after a reconnect.
            return sent.code, f"a frame over this client's max_frame_bytes ({self._max_frame})"
        return ws.close_code, ws.close_reason or ""

    def _attach(self, ws: ClientConnection) -> None:
        # Synchronous on purpose: every request pending now is queued here, every later one
        # by its caller, so each is sent exactly once on this connection.
        self._ws = ws
        self._outbox.clear()
        self._forget_subscriptions()
        waiting = self._protocol.pending()  # before the feeds register their new subscribes
        for feed in list(self._feeds.values()):
            feed.on_connected()
        for _, handler in waiting:  # in the order they were first sent
            data = None
            if isinstance(handler, _Pending):
                data = handler.data
            elif isinstance(handler, RidStream):
                data = handler.on_attach()
            if data is not None:
                self._outbox.append(data)
        self._wake.set()

    def _detach(self) -> None:
        self._ws = None
        self._outbox.clear()
        self._forget_subscriptions()
        for feed in self._feeds.values():
            feed.on_disconnected()

    def _forget_subscriptions(self) -> None:
        """A connection ended: its subscribes and unsubscribes died with it (feeds subscribe
        again on the next one themselves)."""
        for rid, handler in self._protocol.pending():
            if isinstance(handler, WorkspaceFeed | UnsubscribeSent):
                self._protocol.forget(rid)

    async def _write(self, ws: ClientConnection) -> None:
        outbox = self._outbox
        try:
            while True:
                while not outbox:
                    self._wake.clear()
                    await self._wake.wait()
                while outbox:
                    await ws.send(outbox.popleft(), text=True)
        except ConnectionClosed:
            return  # the reader sees the close and reconnects

    def _connected(self) -> bool:
        return self._ws is not None

    def _send(self, data: bytes) -> None:
        if self._ws is not None:
            self._outbox.append(data)
            self._wake.set()

    def _rid(self) -> int:
        return self._protocol.next_rid()

    def _expect(self, rid: int, stream: RidStream, *, once: bool) -> None:
        """Route the replies to ``rid`` to ``stream`` (an exec call or a getExec stream)."""
        self._protocol.expect(rid, stream, once=once)

    def _forget(self, rid: int) -> None:
        self._protocol.forget(rid)

    def _send_control(
        self, frame: frames.Subscribe | frames.Unsubscribe, handler: WorkspaceFeed | UnsubscribeSent
    ) -> int:
        """Queue a subscribe (handled by its feed) or an unsubscribe on the current connection
        (never resent: feeds resubscribe on the next connection themselves). A subscribe's rid
        stays registered while it is in force: the hub may end the subscription later with an
        error carrying it (a failed catch-up)."""
        once = isinstance(handler, UnsubscribeSent)
        rid, data = self._protocol.request(frame, handler, once=once)
        self._send(data)
        return rid

    def _drop_idle_feed(self) -> bool:
        """Unsubscribe the oldest followed workspace no one is reading (the hub limits
        subscriptions per connection); False if there is none."""
        for feed in self._feeds.values():
            if not feed.cursors and feed.confirmed:
                feed.leave()
                return True
        return False

    def _feed(self, workspace: str) -> WorkspaceFeed:
        feed = self._feeds.get(workspace)
        if feed is None:
            feed = self._feeds[workspace] = WorkspaceFeed(self, workspace)
        return feed

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing is not None or self._task is None:
            raise SessionClosed("the session is not open" if self._task is None else "closed")

    def _fail(self, error: AgoraError, *, clean: bool = False) -> None:
        """End the session: fail pending calls with ``error``; end subscriptions (cleanly when
        the user closed the session)."""
        if self._failure is None:
            self._failure = error
        for rid, handler in self._protocol.pending():
            self._protocol.forget(rid)
            if isinstance(handler, _Pending):
                if not handler.future.done():
                    handler.future.set_exception(error)
            elif isinstance(handler, RidStream):
                handler.fail(error)
        for feed in list(self._feeds.values()):
            feed.fail(None if clean else error)
        self._feeds.clear()

    # -- frames ----------------------------------------------------------------------------

    def _dispatch(self, raw: str | bytes) -> None:
        """Act on one frame, as the protocol reads it."""
        incoming = self._protocol.receive(raw)
        match incoming:
            case EventIn():
                self._delivered += 1
                feed = self._feeds.get(incoming.workspace)
                if feed is not None:
                    feed.on_event(incoming)
            case Reply(rid=rid, handler=handler, frame=frame):
                if isinstance(handler, _Pending):
                    if not handler.future.done():
                        handler.future.set_result(frame)
                elif isinstance(handler, RidStream):
                    handler.on_reply(frame)
                elif isinstance(handler, WorkspaceFeed) and isinstance(frame, frames.Subscribed):
                    handler.on_subscribed(rid, frame.head)
            case Refused(rid=rid, handler=handler, error=error):
                if isinstance(handler, _Pending):
                    if not handler.future.done():
                        handler.future.set_exception(error)
                elif isinstance(handler, RidStream):
                    handler.on_refused(error)
                elif isinstance(handler, WorkspaceFeed):
                    handler.on_error(rid, error)
            case Garbled(handler=handler, error=error):
                if isinstance(handler, _Pending):
                    if not handler.future.done():
                        handler.future.set_exception(error)
                elif isinstance(handler, RidStream):
                    handler.on_garbled(error)
                else:
                    log.debug("unreadable reply to a subscription dropped: %s", error)
            case Notice(error=error, fatal=fatal):
                log.warning("hub error %s: %s %s", error.code, error.message, error.details)
                if fatal:  # the token is no longer valid: the hub closes with 4401 next
                    self._failure = self._failure or error
            case Dropped(reason=reason):
                log.debug("frame dropped: %s", reason)

    # -- requests --------------------------------------------------------------------------

    async def request(self, frame: frames.ClientFrame) -> frames.ServerFrame:
        """Send ``frame`` (its ``rid`` is set here) and return the reply.

        Sent again after a reconnect until answered, so only use it for idempotent requests
        (``publish`` with event ids, ``state``). Raises the :mod:`hub.core.errors` class of an
        ``error`` reply, or what ended the session (``Unauthorized``, ``Unavailable``,
        :class:`SessionClosed`).
        """
        self._check_usable()
        rid = self._rid()
        data = encode_frame(frame, rid)
        future: asyncio.Future[frames.ServerFrame] = asyncio.get_running_loop().create_future()
        self._protocol.expect(rid, _Pending(data, future))
        self._send(data)
        try:
            return await future
        finally:
            self._protocol.forget(rid)  # answered (already forgotten), failed or cancelled


def connect(
    url: str | Sequence[str],
    token: str,
    *,
    reconnect: bool = True,
    backoff: Backoff | None = None,
    history: int = DEFAULT_HISTORY,
    history_bytes: int = DEFAULT_HISTORY_BYTES,
    retry_rate_limited: bool = True,
    open_timeout: float = 10.0,
    max_frame_bytes: int = DEFAULT_MAX_FRAME,
    compression: str | None = None,
    verify: bool = False,
    checkpoint_key: str | NoteVerifier | None = None,
    witness_file: str | Path | None = None,
    max_identical_closes: int = MAX_IDENTICAL_CLOSES,
) -> Session:
    """A session with the hub at ``url`` (``ws://host:port``), authenticated by ``token``.

    ``url`` may be a list of the nodes of one cluster (sharing one PostgreSQL store): the
    session opens on the first that answers; when its node closes the connection (but for a
    normal close or 4408: :data:`STAY_CLOSES`) it reconnects to the next one first, and each
    failed attempt moves on again (round robin, under ``backoff``), resuming every
    subscription where it was.

    Use ``async with connect(url, token) as session:``; entering raises
    :class:`~hub.core.errors.Unauthorized` for a bad or expired token and
    :class:`~hub.core.errors.Unavailable` when the hub cannot be reached. ``reconnect``: resume
    after a dropped connection or a 4408 close (``backoff`` bounds the delays and how long to
    try). ``history``/``history_bytes``: the recent events kept per followed workspace (a
    subscriber further behind is replayed from the log). ``retry_rate_limited``: a publish
    refused with ``rateLimited`` is sent again after the wait the hub names (a few times)
    instead of raising :class:`~hub.core.errors.RateLimited`. ``max_identical_closes``: see
    :data:`MAX_IDENTICAL_CLOSES`. ``compression``: ``"deflate"`` to offer permessage-deflate
    (off by default: it costs latency on a LAN).

    ``verify``: check every checkpoint the hub shows (``ws.checkpoint()``,
    ``ws.verify_inclusion(event)``) against ``checkpoint_key`` (the hub's public key, pinned:
    the verifier key text or a file holding it) and against the checkpoints seen before,
    raising :class:`~hub.core.errors.TamperDetected` for a history that does not extend them;
    ``witness_file`` keeps the last checkpoint seen per workspace across runs
    (:mod:`hub.client.verify`, docs/audit.md).
    """
    return Session(
        url,
        token,
        reconnect=reconnect,
        backoff=backoff,
        history=history,
        history_bytes=history_bytes,
        retry_rate_limited=retry_rate_limited,
        open_timeout=open_timeout,
        max_frame_bytes=max_frame_bytes,
        compression=compression,
        verify=verify,
        checkpoint_key=checkpoint_key,
        witness_file=witness_file,
        max_identical_closes=max_identical_closes,
    )
