"""The Python client of the Agora hub (WebSocket protocol ``agora.v1``, docs/protocol.md).

::

    async with connect("ws://127.0.0.1:8765", token) as session:
        ws = session.workspace("demo")
        item = await ws.request_work("parser", {"spec": "…"})
        reply = await ws.wait_for_kind(item.correlation_id, "workPublished", timeout=60)

Design (the weak points of adk-code's collaboration API that this fixes):

- **Waiters read the log first.** Every waiter subscribes with ``afterSeq`` (0, a seq the caller
  knows, or the seq that opened the work item) and scans history before following live events,
  so an event published just before the wait is never missed.
- **Nothing is lost silently.** A session follows each workspace it reads with one wire
  subscription and keeps a bounded window of the recent events; every local subscriber and
  waiter is a cursor over that window (the seq of the last event it got). After a dropped
  connection or a ``4408`` (too slow) close the session reconnects with exponential backoff and
  jitter and resubscribes from the end of the window, so subscribers see every event once, in
  order. A subscriber that falls behind the window is replayed from the log, never skipped.
  The wire subscription lasts as long as the session (or :meth:`Workspace.leave`), so waiters
  coming and going do not make the agent leave and rejoin the workspace (presence events).
- **Retries are idempotent.** Publishes carry client-minted UUID ids; requests in flight when a
  connection drops are sent again on the next one, and the hub answers a repeated id with the
  original seq and ``duplicate: true``.
- **Typed errors.** ``error`` frames become :mod:`hub.core.errors` classes in one place
  (:func:`error_from_frame`); close codes that must not be retried (4401, 1008, 1009) become
  :class:`~hub.core.errors.Unauthorized`, :class:`~hub.core.errors.BadRequest` and
  :class:`~hub.core.errors.TooLarge`.

One task per session owns the connection: it reads and demultiplexes frames (replies by
``rid``, events by workspace) and reconnects; a second task per connection writes the outgoing
frames in order. Both are created by the session and ended by :meth:`Session.aclose`
(idempotent, shielded from cancellation).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Self, TypeVar, cast

import msgspec
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.typing import Subprotocol

from hub.core.backoff import Backoff
from hub.core.errors import (
    FATAL_CLOSES,
    AgoraError,
    BadRequest,
    Busy,
    CloseCode,
    Internal,
    NotFound,
    RateLimited,
    ServerError,
    Unauthorized,
    Unavailable,
    error_class,
    is_known_code,
)
from hub.core.events import (
    AnyEvent,
    Blocked,
    Completed,
    Event,
    ExecOutput,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.execution.policy import PolicyPatch
from hub.core.projections.workspace import WorkspaceState
from hub.core.wire import frames

__all__ = [
    "Ack",
    "Backoff",
    "BatchAck",
    "ExecHandle",
    "ExecResult",
    "ExecUpdate",
    "Session",
    "SessionClosed",
    "Subscription",
    "Workspace",
    "WorkspaceRuntime",
    "connect",
    "error_from_frame",
]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)

DEFAULT_HISTORY: Final = 4096
"""Recent events a session keeps per followed workspace for its subscribers and waiters."""

DEFAULT_HISTORY_BYTES: Final = 32 * 1024 * 1024
"""... and at most this many bytes of them (as received)."""

DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024
"""Largest frame the client accepts (``state`` frames carry inline file content)."""

RATE_LIMIT_RETRIES: Final = 8
"""How often a rate-limited publish is sent again (after the wait the hub asked for)."""

MAX_RATE_LIMIT_WAIT: Final = 5.0
"""Seconds: the longest wait before sending a rate-limited publish again."""

CATCH_UP_RETRIES: Final = 5
"""Subscribes retried in a row after the hub failed to read a catch-up (then it raises)."""

INDEX_SIZE: Final = 4096
"""Work items whose topic and opening seq a :class:`Workspace` handle remembers."""

# Work-item kinds after which an item is no longer up for grabs (``wait_for_work``).
_TAKEN: Final = frozenset({"workClaimed", "completed", "workCancelled"})


# ---------------------------------------------------------------------------------------------
# Results and errors


class Ack(msgspec.Struct, frozen=True):
    """A single publish was appended (or, ``duplicate``, had been appended before) at ``seq``."""

    workspace: str
    seq: int
    id: str
    duplicate: bool = False


class BatchAck(msgspec.Struct, frozen=True):
    """An atomic batch was appended at ``seqs`` (one per event, in order)."""

    workspace: str
    seqs: list[int]
    ids: list[str]
    duplicate: bool = False


class SessionClosed(Unavailable):
    """The session was closed (by :meth:`Session.aclose`) before the call could complete."""


def error_from_frame(frame: frames.Error) -> AgoraError:
    """The :mod:`hub.core.errors` exception an ``error`` frame stands for (unknown codes: Internal).

    Read from :data:`hub.core.errors.ERROR_TABLE`; ``details`` is kept as sent.
    """
    error = error_class(frame.code)(frame.message)
    error.details = dict(frame.details)
    if not is_known_code(frame.code):
        error.details.setdefault("code", frame.code)
    return error


def _close_error(code: int | None, reason: str) -> AgoraError | None:
    """The error to raise for a fatal close code, or None when a reconnect may help."""
    cls = FATAL_CLOSES.get(code or 0)
    if cls is None:
        return None
    return cls(f"the hub closed the connection ({code}: {reason or 'no reason'})", closeCode=code)


# ---------------------------------------------------------------------------------------------
# Wire encoding

_frame_decoder: Final = msgspec.json.Decoder(frames.AnyServerFrame)
_encoder: Final = msgspec.json.Encoder()


def _to_event(obj: Any) -> Event | None:
    """A typed event from the decoded JSON of an ``event`` frame; None for a kind this client
    does not know (a newer hub)."""
    try:
        ev: Event = msgspec.convert(obj, AnyEvent)
    except msgspec.ValidationError:
        return None
    return ev


def _seq_of(obj: Any) -> int | None:
    seq = obj.get("seq") if isinstance(obj, dict) else None
    return seq if isinstance(seq, int) else None


# ---------------------------------------------------------------------------------------------
# Feeds: one wire subscription per workspace; local subscribers are cursors over its window


class _Cursor:
    """One local subscriber: the seq of the last event it was given, and its head.

    ``last`` is None for a live-only subscriber until the feed knows the head.
    """

    __slots__ = ("closed", "error", "feed", "head", "last")

    def __init__(self, feed: _Feed, after_seq: int | None) -> None:
        self.feed = feed
        self.last = after_seq
        self.closed = False
        self.error: BaseException | None = None
        self.head: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def set_head(self, head: int) -> None:
        if not self.head.done():
            self.head.set_result(head)

    def finish(self, error: BaseException | None) -> None:
        """End the subscriber: with ``error``, or cleanly (iteration stops) when None."""
        self.closed = True
        if error is not None and self.error is None:
            self.error = error
        if not self.head.done():
            self.head.set_exception(error or SessionClosed("the subscription was closed"))
            self.head.exception()  # mark retrieved: head() raises it to whoever awaits

    async def get(self) -> Event:
        feed = self.feed
        while True:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise StopAsyncIteration
            if self.last is not None:
                found, ev = feed.at(self.last + 1)
                if found:
                    self.last += 1
                    if ev is not None:
                        return ev
                    continue  # a kind this client does not know: skipped, seq kept
                if self.last < feed.first:
                    feed.rewind(self.last)  # fell out of the window: read it again
            await feed.changed()


class _Feed:
    """The wire subscription of one workspace and a window of the events it delivered.

    The window holds the contiguous seqs ``first+1 .. position`` (bounded by ``history``
    events and ``history_bytes``); a subscriber reads it at its own pace. One that falls behind
    the window makes the feed *rewind*: resubscribe from that subscriber's seq (the hub replays
    from the log). The feed stays subscribed until the session closes or
    :meth:`Workspace.leave`, so waiters coming and going do not make the agent leave and rejoin
    the workspace (presence events) each time.
    """

    def __init__(self, session: Session, workspace: str) -> None:
        self.session = session
        self.workspace = workspace
        self.cursors: list[_Cursor] = []
        self.window: deque[tuple[Event | None, int]] = deque()
        self.window_bytes = 0
        self.first = 0  # the window holds seqs first+1 .. position
        self.position = 0
        self.started = False  # position/first mean something (a subscribe was confirmed)
        self.head = 0
        self.rid: int | None = None  # the subscribe in force, or awaiting its reply
        self.after: int | None = None  # its afterSeq
        self.confirmed = False
        self.wanted: int | None = None  # a rewind asked for while a subscribe is pending
        self.retried_busy = False
        self.failures = 0  # catch-up failures in a row
        self._waiters: list[asyncio.Future[None]] = []

    # -- the window -----------------------------------------------------------------------

    def at(self, seq: int) -> tuple[bool, Event | None]:
        index = seq - self.first - 1
        if self.started and 0 <= index < len(self.window):
            return True, self.window[index][0]
        return False, None

    async def changed(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                waiter.cancel()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _append(self, seq: int, ev: Event | None, size: int) -> None:
        self.window.append((ev, size))
        self.window_bytes += size
        self.position = seq
        limits = self.session.history, self.session.history_bytes
        while len(self.window) > 1 and (
            len(self.window) > limits[0] or self.window_bytes > limits[1]
        ):
            _, dropped = self.window.popleft()
            self.window_bytes -= dropped
            self.first += 1

    def _restart(self, after: int) -> None:
        self.window.clear()
        self.window_bytes = 0
        self.first = self.position = after

    # -- local subscribers ----------------------------------------------------------------

    def add(self, cursor: _Cursor) -> None:
        self.cursors.append(cursor)
        if self.rid is None:
            self.subscribe(cursor.last)
        elif self.confirmed:
            head = max(self.head, self.position)
            if cursor.last is None:
                cursor.last = head
            cursor.set_head(head)
            if cursor.last < self.first:
                self.rewind(cursor.last)
        elif cursor.last is not None:
            self.rewind(cursor.last)
        self._wake()

    def remove(self, cursor: _Cursor) -> None:
        if cursor in self.cursors:
            self.cursors.remove(cursor)

    def fail(self, error: BaseException | None) -> None:
        """End every local subscriber (with ``error``, or cleanly when None) and forget the
        feed."""
        for cursor in self.cursors:
            cursor.finish(error)
        self.cursors.clear()
        if self.rid is not None:
            self.session._control.pop(self.rid, None)
        self.rid = None
        self.confirmed = False
        self.session._feeds.pop(self.workspace, None)
        self._wake()

    def leave(self) -> None:
        """Unsubscribe and forget the feed; local subscribers stop."""
        if self.rid is not None:
            self.session._control.pop(self.rid, None)
            self.session._send_control(frames.Unsubscribe(workspace=self.workspace), None)
        self.fail(None)

    # -- wire ------------------------------------------------------------------------------

    def subscribe(self, after: int | None) -> None:
        """(Re)subscribe from ``after`` (None: live only)."""
        self.wanted = None
        if not self.session._connected():
            self.rid = None
            return  # the next connection subscribes (``on_connected``)
        if self.rid is not None:
            self.session._control.pop(self.rid, None)
            self.session._send_control(frames.Unsubscribe(workspace=self.workspace), None)
        self.after = after
        self.confirmed = False
        self.rid = self.session._send_control(
            frames.Subscribe(workspace=self.workspace, after_seq=after), self
        )

    def rewind(self, seq: int) -> None:
        """A subscriber needs the events after ``seq``, which the window does not hold."""
        if self.started and self.first <= seq:
            return
        if self.rid is not None and not self.confirmed:
            if self.after is None or seq < self.after:
                self.wanted = seq if self.wanted is None else min(self.wanted, seq)
            return
        self.subscribe(seq)

    def _resume_point(self) -> int | None:
        """Where to subscribe on a new connection: the end of the window, or earlier if a
        subscriber is behind it."""
        behind = [c.last for c in self.cursors if c.last is not None and c.last < self.position]
        if self.started:
            return min([self.position, *behind])
        known = [c.last for c in self.cursors if c.last is not None]
        return min(known) if known else None

    def on_connected(self) -> None:
        self.rid = None
        self.confirmed = False
        self.subscribe(self._resume_point())

    def on_disconnected(self) -> None:
        self.rid = None
        self.confirmed = False

    def on_subscribed(self, rid: int, head: int) -> None:
        if rid != self.rid:
            return  # a subscribe we have since replaced
        self.confirmed = True
        self.retried_busy = False
        self.head = head
        after = self.after if self.after is not None else head
        if not self.started or after != self.position:
            self._restart(after)
            self.started = True
        for cursor in self.cursors:
            if cursor.last is None:
                cursor.last = head
            cursor.set_head(head)
        wanted, self.wanted = self.wanted, None
        behind = [c.last for c in self.cursors if c.last is not None and c.last < self.first]
        if wanted is not None and wanted < self.first:
            behind.append(wanted)
        if behind:
            self.subscribe(min(behind))
        self._wake()

    def on_error(self, rid: int, error: AgoraError) -> None:
        if rid != self.rid:
            return
        if isinstance(error, Busy) and not self.retried_busy and self.session._drop_idle_feed():
            self.retried_busy = True  # too many subscriptions: an idle one made room
            self.rid = None
            self.subscribe(self.after)
            return
        if self.confirmed and isinstance(error, ServerError) and self.failures < CATCH_UP_RETRIES:
            # The hub could not read the catch-up and ended the subscription (docs/protocol.md,
            # "subscribe"): subscribe again from what we hold, after a pause.
            self.failures += 1
            self.rid = None
            self.confirmed = False
            delay = self.session._backoff.delay(self.failures)
            asyncio.get_running_loop().call_later(delay, self._retry)
            return
        self.fail(error)

    def _retry(self) -> None:
        if self.rid is None and self.session._feeds.get(self.workspace) is self:
            self.subscribe(self.position if self.started else self._resume_point())

    def on_event(self, obj: Any, size: int) -> None:
        seq = _seq_of(obj)
        if seq is None:
            log.warning("event without a seq in workspace %s dropped", self.workspace)
            return
        if seq > self.head:
            self.head = seq
        if not self.started or seq <= self.position:
            return  # before the window starts, or already held (a replay)
        if seq > self.position + 1:
            if self.confirmed:
                log.info("gap in %s after seq %s: resubscribing", self.workspace, self.position)
                self.subscribe(self.position)
            return
        ev = _to_event(obj)
        if ev is None:
            log.warning("event %s of an unknown kind skipped (workspace %s)", seq, self.workspace)
        self.failures = 0
        self._append(seq, ev, size)
        self._wake()


class Subscription:
    """The events of one workspace with ``seq > after_seq``, in order, then live ones.

    An async iterator of typed :class:`hub.core.events.Event` objects and an async context manager
    (``async with ws.subscribe(0) as sub: async for ev in sub: …``). Every event comes once, in
    seq order, across reconnects. Iterating raises what ended the session
    (:class:`~hub.core.errors.Unauthorized`, :class:`~hub.core.errors.Unavailable` when
    reconnecting gave
    up) or the subscribe error (:class:`~hub.core.errors.Forbidden` without the read right,
    :class:`~hub.core.errors.BadRequest` for an ``after_seq`` beyond the head); it stops when the
    session is closed, :meth:`aclose` is called or the workspace is left.
    """

    def __init__(self, workspace: Workspace, after_seq: int | None) -> None:
        if after_seq is not None and after_seq < 0:
            raise BadRequest("afterSeq must be >= 0", field="afterSeq")
        self._workspace = workspace
        self._after = after_seq
        self._cursor: _Cursor | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    def _start(self) -> _Cursor:
        if self._cursor is None:
            session = self._workspace.session
            session._check_usable()
            feed = session._feed(self._workspace.name)
            cursor = _Cursor(feed, self._after)
            self._cursor = cursor
            # An abandoned iterator (``break`` out of ``async for``) is dropped when collected.
            self._finalizer = weakref.finalize(self, _drop_cursor, cursor)
            feed.add(cursor)
        return self._cursor

    async def head(self) -> int:
        """The workspace head when the subscription started: history up to it is replayed
        first. Raises as iterating does."""
        return await asyncio.shield(self._start().head)

    @property
    def last_seq(self) -> int | None:
        """The seq of the last event delivered (``after_seq`` before the first)."""
        return self._cursor.last if self._cursor is not None else self._after

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        ev = await self._start().get()
        # Read from the start of the log, the first event of an item seen is its first.
        self._workspace._note(ev, complete=self._after == 0)
        return ev

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop receiving; idempotent."""
        if self._finalizer is not None:
            self._finalizer()


def _drop_cursor(cursor: _Cursor) -> None:
    if not cursor.closed:
        cursor.finish(None)
    cursor.feed.remove(cursor)


# ---------------------------------------------------------------------------------------------
# The session


class _Pending:
    __slots__ = ("data", "future")

    def __init__(self, data: bytes, future: asyncio.Future[frames.ServerFrame]) -> None:
        self.data = data
        self.future = future


class Session:
    """A connection to one hub, reconnecting as needed. Build it with :func:`connect`.

    After :meth:`open` (or ``async with``), ``agent``, ``rights`` and ``server`` hold what the
    hub's ``welcome`` said.
    """

    def __init__(
        self,
        url: str,
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
    ) -> None:
        self.url = url
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
        self._pending: dict[int, _Pending] = {}
        self._streams: dict[int, _RidStream] = {}  # exec calls and getExec streams, by rid
        self._control: dict[int, _Feed | None] = {}
        self._feeds: dict[str, _Feed] = {}
        self._workspaces: dict[str, Workspace] = {}
        self._outbox: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._next_rid = 0
        self._task: asyncio.Task[None] | None = None
        self._closing: asyncio.Future[None] | None = None
        self._failure: AgoraError | None = None
        self._reconnects = 0
        self.last_close: tuple[int | None, str] | None = None
        """The close code and reason of the last connection that ended (None: none did)."""

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
        ws = await self._handshake()
        self._task = asyncio.create_task(self._run(ws), name=f"agora-session {self.url}")

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
                await ws.send(_encoder.encode(frames.Hello(token=self._token, rid=0)), text=True)
                while True:
                    frame = _frame_decoder.decode(await ws.recv())
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
            raise _close_error(code, reason) or Unavailable(
                f"the hub closed the connection during hello ({code})", url=self.url
            ) from e
        except TimeoutError as e:
            await ws.close()
            raise Unavailable(f"no welcome from {self.url} in time", url=self.url) from e
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            await ws.close()
            raise Internal(f"bad frame from {self.url} during hello: {e}") from e
        except BaseException:
            await ws.close()
            raise

    async def _run(self, ws: ClientConnection) -> None:
        """The session's task: serve one connection after another until a fatal close."""
        try:
            while True:
                code, reason = await self._serve(ws)
                self.last_close = code, reason
                fatal = self._failure or _close_error(code, reason)
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
                log.debug("reconnect attempt %d failed: %s", attempt, e)

    async def _serve(self, ws: ClientConnection) -> tuple[int | None, str]:
        """Attach ``ws``, read it until it closes; return the close code and reason."""
        self._current = ws
        self._attach(ws)
        writer = asyncio.create_task(self._write(ws), name="agora-session writer")
        try:
            async for raw in ws:
                self._dispatch(raw)
        except ConnectionClosed:
            pass
        finally:
            self._detach()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        await ws.close()
        return ws.close_code, ws.close_reason or ""

    def _attach(self, ws: ClientConnection) -> None:
        # Synchronous on purpose: every request pending now is queued here, every later one
        # by its caller, so each is sent exactly once on this connection.
        self._ws = ws
        self._outbox.clear()
        self._control.clear()
        for feed in list(self._feeds.values()):
            feed.on_connected()
        for pending in self._pending.values():
            self._outbox.append(pending.data)
        for stream in list(self._streams.values()):
            data = stream.on_attach()
            if data is not None:
                self._outbox.append(data)
        self._wake.set()

    def _detach(self) -> None:
        self._ws = None
        self._outbox.clear()
        self._control.clear()
        for feed in self._feeds.values():
            feed.on_disconnected()

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
        self._next_rid += 1
        return self._next_rid

    def _send_control(self, frame: frames.ClientFrame, feed: _Feed | None) -> int:
        """Queue a subscribe/unsubscribe on the current connection (never resent: feeds
        resubscribe on the next connection themselves)."""
        rid = self._rid()
        self._control[rid] = feed
        self._send(_encoder.encode(msgspec.structs.replace(frame, rid=rid)))
        return rid

    def _drop_idle_feed(self) -> bool:
        """Unsubscribe the oldest followed workspace no one is reading (the hub limits
        subscriptions per connection); False if there is none."""
        for feed in self._feeds.values():
            if not feed.cursors and feed.confirmed:
                feed.leave()
                return True
        return False

    def _feed(self, workspace: str) -> _Feed:
        feed = self._feeds.get(workspace)
        if feed is None:
            feed = self._feeds[workspace] = _Feed(self, workspace)
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
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(error)
        self._pending.clear()
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.fail(error)
        for feed in list(self._feeds.values()):
            feed.fail(None if clean else error)
        self._feeds.clear()

    # -- frames ----------------------------------------------------------------------------

    def _dispatch(self, raw: str | bytes) -> None:
        try:
            frame = _frame_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._unknown_frame(raw, e)
            return
        if isinstance(frame, frames.EventFrame):
            feed = self._feeds.get(frame.workspace)
            if feed is not None:
                feed.on_event(frame.event, len(raw))
            return
        rid = frame.rid
        if isinstance(rid, int) and rid in self._control:
            # A subscribe's rid stays registered while it is in force: the hub may end the
            # subscription later with an error carrying it (a failed catch-up).
            feed = self._control[rid]
            if feed is None or isinstance(frame, frames.Error):
                del self._control[rid]
            if feed is not None:
                if isinstance(frame, frames.Subscribed):
                    feed.on_subscribed(rid, frame.head)
                elif isinstance(frame, frames.Error):
                    feed.on_error(rid, error_from_frame(frame))
            return
        stream = self._streams.get(rid) if isinstance(rid, int) else None
        if stream is not None:
            stream.on_frame(frame)
            return
        pending = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if pending is None:
            if isinstance(frame, frames.Error):
                log.warning("hub error %s: %s %s", frame.code, frame.message, frame.details)
                if frame.code == Unauthorized.code:
                    self._failure = self._failure or error_from_frame(frame)
            return
        if pending.future.done():
            return
        if isinstance(frame, frames.Error):
            pending.future.set_exception(error_from_frame(frame))
        else:
            pending.future.set_result(frame)

    def _unknown_frame(self, raw: str | bytes, error: Exception) -> None:
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            log.warning("undecodable frame from the hub dropped: %s", error)
            return
        rid = obj.get("rid") if isinstance(obj, dict) else None
        pending = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if pending is not None and not pending.future.done():
            pending.future.set_exception(Internal(f"unexpected reply from the hub: {error}"))
        else:
            log.debug("frame of an unknown shape dropped: %s", error)

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
        data = _encoder.encode(msgspec.structs.replace(frame, rid=rid))
        future: asyncio.Future[frames.ServerFrame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(data, future)
        self._send(data)
        try:
            return await future
        finally:
            self._pending.pop(rid, None)


def connect(
    url: str,
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
) -> Session:
    """A session with the hub at ``url`` (``ws://host:port``), authenticated by ``token``.

    Use ``async with connect(url, token) as session:``; entering raises
    :class:`~hub.core.errors.Unauthorized` for a bad or expired token and
    :class:`~hub.core.errors.Unavailable` when the hub cannot be reached. ``reconnect``: resume
    after a dropped connection or a 4408 close (``backoff`` bounds the delays and how long to
    try). ``history``/``history_bytes``: the recent events kept per followed workspace (a
    subscriber further behind is replayed from the log). ``retry_rate_limited``: a publish
    refused with ``rateLimited`` is sent again after the wait the hub names (a few times)
    instead of raising :class:`~hub.core.errors.RateLimited`. ``compression``: ``"deflate"`` to
    offer permessage-deflate (off by default: it costs latency on a LAN).
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
    )


# ---------------------------------------------------------------------------------------------
# Workspaces


class Workspace:
    """One workspace through a session: publish, subscribe, state, files, work items.

    Every call raises what ended the session (:class:`~hub.core.errors.Unauthorized`,
    :class:`~hub.core.errors.Unavailable`, :class:`SessionClosed`) besides the errors it lists.
    """

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self.name = name
        self.runtime = WorkspaceRuntime(self)
        """Executions in this workspace (docs/execution.md, "Runtime")."""
        # correlationId -> (topic, seq of the item's first event or 0 if unknown); bounded.
        self._items: OrderedDict[str, tuple[str | None, int]] = OrderedDict()

    def __repr__(self) -> str:
        return f"Workspace({self.name!r}, agent={self.session.agent!r})"

    # -- publishing ------------------------------------------------------------------------

    def _draft(self, event: Event | Mapping[str, Any]) -> Event:
        if isinstance(event, Mapping):
            try:
                event = msgspec.convert(dict(event), AnyEvent)
            except msgspec.ValidationError as e:
                raise BadRequest(f"not a valid event: {e}", field="event") from e
        if not isinstance(event, Event):
            raise BadRequest(f"expected an Event, got {type(event).__name__}", field="event")
        if event.seq:
            raise BadRequest("a draft must not carry a seq (the log assigns it)", field="seq")
        return msgspec.structs.replace(event, id=event.id or str(uuid.uuid4()), workspace=self.name)

    async def publish(
        self, event: Event | Mapping[str, Any], expected_seq: int | None = None
    ) -> Ack:
        """Append one event (a draft, or its JSON as a dict) and return its :class:`Ack`.

        A missing ``id`` is minted here (UUID), so a retry is idempotent. ``expected_seq``: the
        head this write is based on. Raises :class:`~hub.core.errors.BadRequest`/``TooLarge``
        (invalid), ``Forbidden`` (no write right, a hub-only kind, not the owner),
        ``Conflict`` (stale ``expected_seq``/``baseRev``, terminal or foreign work item;
        ``details['head']``), ``NotFound``, ``RateLimited`` (still limited after the
        retries, or at once when the session does not retry).
        """
        draft = self._draft(event)
        reply = await self._publish(
            frames.Publish(workspace=self.name, event=cast(Any, draft), expected_seq=expected_seq)
        )
        if not isinstance(reply, frames.Ack) or reply.seq is None:
            raise Internal(f"unexpected reply to publish: {type(reply).__name__}")
        return Ack(self.name, reply.seq, reply.id or draft.id, reply.duplicate)

    async def publish_batch(
        self, events: Iterable[Event | Mapping[str, Any]], expected_seq: int | None = None
    ) -> BatchAck:
        """Append ``events`` atomically (all or none). Raises as :meth:`publish`; an error's
        ``details['index']`` names the offending event."""
        drafts = [self._draft(e) for e in events]
        if not drafts:
            raise BadRequest("a batch needs at least one event", field="events")
        reply = await self._publish(
            frames.Publish(workspace=self.name, events=cast(Any, drafts), expected_seq=expected_seq)
        )
        if not isinstance(reply, frames.Ack) or reply.seqs is None:
            raise Internal(f"unexpected reply to publish: {type(reply).__name__}")
        ids = reply.ids if reply.ids is not None else [d.id for d in drafts]
        return BatchAck(self.name, list(reply.seqs), list(ids), reply.duplicate)

    async def _publish(self, frame: frames.Publish) -> frames.ServerFrame:
        """Send a publish; on ``rateLimited`` wait (the ``retryAfterMs`` the hub asked for,
        doubled on each attempt, with jitter) and send it again, at most
        ``RATE_LIMIT_RETRIES`` times unless the session says not to retry."""
        attempt = 0
        while True:
            try:
                return await self.session.request(frame)
            except RateLimited as e:
                attempt += 1
                if not self.session.retry_rate_limited or attempt > RATE_LIMIT_RETRIES:
                    raise
                wait_ms = e.details.get("retryAfterMs", 100)
                wait = wait_ms / 1000 if isinstance(wait_ms, int | float) else 0.1
                # Publishers refused together must not come back together: back off, jitter.
                wait = min(MAX_RATE_LIMIT_WAIT, max(0.001, wait) * 2 ** (attempt - 1))
                await asyncio.sleep(wait * (0.5 + random.random()))  # jitter, not crypto

    async def _emit(self, draft: E, *, opens: bool = False) -> E:
        """Publish ``draft``; return it as stored (id, seq, workspace, producer filled in;
        timestamp and hash are in the log). ``opens``: it is the first event of its item."""
        prepared = cast(E, self._draft(draft))
        ack = await self.publish(prepared)
        stored = msgspec.structs.replace(
            prepared, id=ack.id, seq=ack.seq, producer=self.session.agent
        )
        self._note(stored, complete=opens)
        return stored

    # -- reading ---------------------------------------------------------------------------

    def subscribe(self, after_seq: int | None = None) -> Subscription:
        """Every event with ``seq > after_seq`` in order, then live ones; ``after_seq`` None =
        live only. Raises :class:`~hub.core.errors.BadRequest` for a negative ``after_seq``; while
        iterating, ``Forbidden`` without the read right.

        The session follows the workspace from then on (one wire subscription, shared by every
        subscriber and waiter) until it closes or :meth:`leave` is called."""
        return Subscription(self, after_seq)

    def leave(self) -> None:
        """Stop following the workspace (unsubscribe); its subscriptions stop."""
        feed = self.session._feeds.get(self.name)
        if feed is not None:
            feed.leave()

    async def state(self, at_seq: int | None = None) -> WorkspaceState:
        """The workspace state (files, work items, executions, artifacts, members), now or at
        ``at_seq``. Raises ``Forbidden`` (no read right), ``BadRequest``."""
        reply = await self.session.request(frames.GetState(workspace=self.name, at_seq=at_seq))
        if not isinstance(reply, frames.StateFrame):
            raise Internal(f"unexpected reply to state: {type(reply).__name__}")
        try:
            state: WorkspaceState = msgspec.convert(reply.state, WorkspaceState)
        except msgspec.ValidationError as e:
            raise Internal(f"the hub sent a state this client cannot read: {e}") from e
        return state

    async def head(self) -> int:
        """The seq of the workspace's last event (0 when empty). Raises ``Forbidden``."""
        async with self.subscribe(None) as sub:
            return await sub.head()

    async def events(self, after_seq: int = 0) -> list[Event]:
        """The whole history (every event with ``seq > after_seq`` up to the current head)."""
        out: list[Event] = []
        async with self.subscribe(after_seq) as sub:
            head = await sub.head()
            if head <= after_seq:
                return out
            async for ev in sub:
                out.append(ev)
                if ev.seq >= head:
                    return out
        raise SessionClosed("the session closed while reading the history")

    # -- files -----------------------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        content: str | bytes,
        base_rev: int | None = None,
        *,
        media_type: str | None = None,
    ) -> FileWritten:
        """Write ``path`` (text as UTF-8, bytes as base64). ``base_rev``: the rev this write
        replaces (0: the file must not exist; None: no check). Raises ``Conflict`` (stale
        ``base_rev``, ``details['rev']``), ``BadRequest`` (bad path), ``TooLarge``."""
        if isinstance(content, str):
            payload = FileWrittenPayload(
                path=path, text=content, base_rev=base_rev, media_type=media_type
            )
        else:
            payload = FileWrittenPayload(
                path=path,
                base64=base64.b64encode(content).decode("ascii"),
                base_rev=base_rev,
                media_type=media_type,
            )
        return await self._emit(FileWritten(payload=payload))

    async def read_file(self, path: str) -> str | bytes:
        """The current content of ``path`` from the state: ``str`` if it was written as text,
        else ``bytes``. Raises ``NotFound`` (no such file, or the content lives in the blob
        store, which ``agora.v1`` cannot read: ``details['blob']``)."""
        entry = (await self.state()).files.get(path)
        if entry is None:
            raise NotFound(f"no file {path!r} in workspace {self.name!r}", path=path)
        if entry.text is not None:
            return entry.text
        if entry.base64 is not None:
            return base64.b64decode(entry.base64)
        raise NotFound(
            f"{path!r} is in the blob store ({entry.size} bytes); its content is not inline",
            path=path,
            blob=entry.blob,
        )

    async def delete_file(self, path: str, base_rev: int | None = None) -> FileDeleted:
        """Delete ``path``. Raises ``NotFound`` (no such file), ``Conflict`` (stale
        ``base_rev``)."""
        return await self._emit(
            FileDeleted(payload=FileDeletedPayload(path=path, base_rev=base_rev))
        )

    async def move_file(self, src: str, dst: str, base_rev: int | None = None) -> FileMoved:
        """Move ``src`` to ``dst``. Raises ``NotFound`` (no ``src``), ``Conflict`` (``dst``
        exists, stale ``base_rev``)."""
        return await self._emit(
            FileMoved(payload=FileMovedPayload(from_=src, to=dst, base_rev=base_rev))
        )

    async def post_message(self, text: str | None = None, data: Any = None) -> MessagePosted:
        """Post a conversation message."""
        return await self._emit(MessagePosted(payload=MessagePayload(text=text, data=data)))

    # -- work items (adk-code's verbs) -----------------------------------------------------

    def _note(self, ev: Event, *, complete: bool) -> None:
        """Remember a work item's topic (to default it in later verbs) and, when ``complete``
        (``ev`` is certainly the item's first event), its seq (waiters start there)."""
        cid = ev.correlation_id
        if cid is None or ev.kind not in _WORK_KINDS:
            return
        known = self._items.get(cid)
        if known is not None and (known[1] or not complete) and (known[0] or not ev.topic):
            return
        topic = known[0] if known is not None and known[0] else ev.topic
        first = known[1] if known is not None and known[1] else (ev.seq if complete else 0)
        self._items[cid] = (topic, first)
        if len(self._items) > INDEX_SIZE:
            self._items.popitem(last=False)

    def _topic(self, correlation_id: str, topic: str | None) -> str | None:
        if topic is not None:
            return topic
        known = self._items.get(correlation_id)
        return known[0] if known is not None else None

    async def _work(
        self,
        cls: type[E],
        correlation_id: str,
        payload: Any,
        *,
        topic: str | None,
        consumer: str | None = None,
        causation_id: str | None = None,
    ) -> E:
        draft = cls(
            correlation_id=correlation_id,
            topic=self._topic(correlation_id, topic),
            consumer=consumer,
            causation_id=causation_id,
            payload=payload,  # type: ignore[call-arg]
        )
        return await self._emit(draft)

    async def request_work(
        self, topic: str, payload: Any = None, consumer: str | None = None
    ) -> NeedWork:
        """Open a work item (``needWork``) under a new correlationId; returns the stored event
        (``.correlation_id``, ``.seq``)."""
        draft = NeedWork(
            correlation_id=str(uuid.uuid4()), topic=topic, consumer=consumer, payload=payload
        )
        return await self._emit(draft, opens=True)

    async def claim_work(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> WorkClaimed:
        """Take ownership (``workClaimed``). Raises ``Conflict`` (claimed by another agent, or
        the item is completed/cancelled)."""
        return await self._work(
            WorkClaimed, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def publish_work(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> WorkPublished:
        """Announce a work product (``workPublished``). Raises ``Forbidden`` (not the owner),
        ``Conflict`` (item finished)."""
        return await self._work(
            WorkPublished,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def request_feedback(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> FeedbackRequested:
        """Ask for feedback (``feedbackRequested``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            FeedbackRequested,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def provide_feedback(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        consumer: str | None = None,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> FeedbackProvided:
        """Give feedback (``feedbackProvided``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            FeedbackProvided,
            correlation_id,
            payload,
            topic=topic,
            consumer=consumer,
            causation_id=causation_id,
        )

    async def signal_blocked(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> Blocked:
        """Say the item cannot progress (``blocked``). Raises ``Conflict`` (item finished)."""
        return await self._work(
            Blocked, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def signal_completed(
        self,
        correlation_id: str,
        payload: Any = None,
        *,
        topic: str | None = None,
        causation_id: str | None = None,
    ) -> Completed:
        """Close the item (``completed``, terminal). Raises ``Forbidden`` (an owned item
        closed by a non-owner), ``Conflict`` (already finished)."""
        return await self._work(
            Completed, correlation_id, payload, topic=topic, causation_id=causation_id
        )

    async def cancel_work(
        self, correlation_id: str, payload: Any = None, *, topic: str | None = None
    ) -> WorkCancelled:
        """Cancel the item (``workCancelled``, terminal). Raises ``Forbidden`` (neither the
        requester nor the owner), ``Conflict`` (already finished)."""
        return await self._work(WorkCancelled, correlation_id, payload, topic=topic)

    # -- waiters ---------------------------------------------------------------------------

    def _start(self, correlation_id: str | None, after_seq: int | None) -> int:
        """Where a waiter starts reading: ``after_seq``, else just before the item's first
        event if this handle knows it, else the beginning of the log."""
        if after_seq is not None:
            return after_seq
        if correlation_id is not None:
            known = self._items.get(correlation_id)
            if known is not None and known[1] > 0:
                return known[1] - 1
        return 0

    async def wait_for(
        self,
        correlation_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
        kinds: Iterable[str] | None = None,
        exclude_self: bool = False,
    ) -> Event:
        """The first event of work item ``correlation_id`` with ``seq > after_seq`` (of one of
        ``kinds`` if given; not produced by this agent if ``exclude_self``).

        Reads the log first, from ``after_seq`` (default: the item's first event, or the start
        of the log), then waits for live events, so an event published before the call is
        found. Raises ``TimeoutError`` after ``timeout`` seconds, ``SessionClosed``.
        """
        wanted = frozenset(kinds) if kinds is not None else None
        me = self.session.agent
        start = self._start(correlation_id, after_seq)
        async with asyncio.timeout(timeout), self.subscribe(start) as sub:
            async for ev in sub:
                if ev.correlation_id != correlation_id:
                    continue
                if wanted is not None and ev.kind not in wanted:
                    continue
                if exclude_self and ev.producer == me:
                    continue
                return ev
        raise SessionClosed("the session closed while waiting")

    async def wait_for_kind(
        self,
        correlation_id: str,
        kind: str | type[Event],
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
    ) -> Event:
        """The first event of ``kind`` (``"workPublished"`` or the class) in work item
        ``correlation_id`` with ``seq > after_seq``; see :meth:`wait_for`. Raises
        ``TimeoutError``."""
        name = kind if isinstance(kind, str) else kind.kind
        return await self.wait_for(correlation_id, timeout, after_seq=after_seq, kinds=(name,))

    async def wait_for_feedback(
        self,
        correlation_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int | None = None,
    ) -> FeedbackProvided:
        """The first ``feedbackProvided`` of the item after ``after_seq``. Raises
        ``TimeoutError``."""
        ev = await self.wait_for_kind(
            correlation_id, FeedbackProvided, timeout, after_seq=after_seq
        )
        assert isinstance(ev, FeedbackProvided)
        return ev

    async def wait_for_work(
        self,
        topic: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (adk-code's API)
        *,
        after_seq: int = 0,
    ) -> NeedWork:
        """An open work request (``needWork``) on ``topic`` (any topic if None) addressed to
        this agent or to anyone, that nobody has claimed, completed or cancelled yet.

        Reads the log from ``after_seq`` to the head first and returns the oldest such request;
        otherwise the next one published. Raises ``TimeoutError``, ``SessionClosed``.
        """
        me = self.session.agent
        open_items: dict[str, NeedWork] = {}
        async with asyncio.timeout(timeout), self.subscribe(after_seq) as sub:
            head = await sub.head()
            caught_up = head <= after_seq
            async for ev in sub:
                cid = ev.correlation_id
                if isinstance(ev, NeedWork):
                    if (
                        cid is not None
                        and (topic is None or ev.topic == topic)
                        and (ev.consumer is None or ev.consumer == me)
                        and cid not in open_items
                    ):
                        open_items[cid] = ev
                elif cid is not None and ev.kind in _TAKEN:
                    open_items.pop(cid, None)
                if ev.seq >= head:
                    caught_up = True
                if caught_up and open_items:
                    return next(iter(open_items.values()))
        raise SessionClosed("the session closed while waiting")


_WORK_KINDS: Final = frozenset(
    {
        "needWork",
        "workClaimed",
        "workPublished",
        "feedbackRequested",
        "feedbackProvided",
        "blocked",
        "completed",
        "workCancelled",
    }
)


# ---------------------------------------------------------------------------------------------
# Executions: ``ws.runtime`` (docs/execution.md, "Runtime")


class ExecUpdate(msgspec.Struct, frozen=True):
    """One event of an execution's stream: the journal ``event`` (``execRequested``,
    ``execStarted``, ``execOutput`` …, ``execCancelRequested``, ``execFinished``) and, for an
    ``execOutput`` of a ``utf8`` execution, its bytes as ``text``."""

    event: Event
    text: str | None = None


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of an execution. ``stdout``/``stderr`` are ``str`` for ``encoding="utf8"``
    (invalid bytes as U+FFFD), else ``bytes``. ``has_value``: the program returned ``value``."""

    status: str
    reason: str
    exit_code: int
    stdout: str | bytes
    stderr: str | bytes
    value: Any = None
    has_value: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    pushed: int = 0
    pulled: int = 0
    skipped: list[dict[str, Any]] = []
    diagnostics: list[Any] = []


def _exec_result(result: frames.RuntimeResult) -> ExecResult:
    def out(text: str) -> str | bytes:
        return text if result.encoding == "utf8" else base64.b64decode(text)

    has_value = result.value is not msgspec.UNSET
    return ExecResult(
        status=result.status,
        reason=result.reason,
        exit_code=result.exit_code,
        stdout=out(result.stdout),
        stderr=out(result.stderr),
        value=result.value if has_value else None,
        has_value=has_value,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        duration_ms=result.duration_ms,
        pushed=result.pushed,
        pulled=result.pulled,
        skipped=[msgspec.to_builtins(s) for s in result.skipped],
        diagnostics=[] if result.diagnostics is msgspec.UNSET else list(result.diagnostics),
    )


class _RidStream:
    """A request the session routes every reply frame of (by rid) instead of resolving a
    pending future: an ``exec`` call (never resent) or a ``getExec`` stream (resent, resuming,
    after a reconnect)."""

    def on_frame(self, frame: frames.ServerFrame) -> None:
        raise NotImplementedError

    def on_attach(self) -> bytes | None:
        """A new connection: the frame to send again, or None."""
        raise NotImplementedError

    def fail(self, error: AgoraError) -> None:
        raise NotImplementedError


class _ExecCall(_RidStream):
    """One ``exec``: sent once, never again after a reconnect (the hub may have started it)."""

    def __init__(self, session: Session, rid: int, exec_id: str, data: bytes) -> None:
        self.session = session
        self.rid = rid
        self.exec_id = exec_id
        self.data = data
        self.sent = False
        self.future: asyncio.Future[frames.ServerFrame] = asyncio.get_running_loop().create_future()

    def _done(self) -> None:
        self.session._streams.pop(self.rid, None)

    def on_frame(self, frame: frames.ServerFrame) -> None:
        self._done()
        if self.future.done():
            return
        if isinstance(frame, frames.Error):
            self.future.set_exception(error_from_frame(frame))
        else:
            self.future.set_result(frame)

    def send(self) -> None:
        if self.session._connected():
            self.session._send(self.data)
            self.sent = True

    def on_attach(self) -> bytes | None:
        if not self.sent:  # not sent yet: goes out on this connection
            self.sent = True
            return self.data
        self.fail(
            Unavailable(
                f"the connection dropped before the hub answered exec {self.exec_id!r}; it may "
                "have started: ws.runtime.get_exec(id) tells",
                execId=self.exec_id,
            )
        )
        return None

    def fail(self, error: AgoraError) -> None:
        self._done()
        if not self.future.done():
            self.future.set_exception(error)


class _ExecFollow(_RidStream):
    """One ``getExec`` stream. After a reconnect it asks again from the last output it got
    and drops what it already delivered (by seq)."""

    def __init__(self, session: Session, rid: int, workspace: str, exec_id: str, resume: Any):
        self.session = session
        self.rid = rid
        self.workspace = workspace
        self.exec_id = exec_id
        self.resume = resume
        self.last_seq = 0
        self.last_n: int | None = None
        self.items: deque[ExecUpdate | AgoraError | None] = deque()
        self.wake = asyncio.Event()

    def frame(self) -> bytes:
        resume = self.resume
        if self.last_seq:
            resume = self.last_n if self.last_n is not None else "full"
        getexec = frames.GetExec(
            rid=self.rid, workspace=self.workspace, exec_id=self.exec_id, resume=resume
        )
        return _encoder.encode(getexec)

    def _push(self, item: ExecUpdate | AgoraError | None) -> None:
        self.items.append(item)
        self.wake.set()

    def close(self) -> None:
        self.session._streams.pop(self.rid, None)

    def on_frame(self, frame: frames.ServerFrame) -> None:
        if isinstance(frame, frames.ExecEvent):
            ev = _to_event(frame.event)
            if ev is None or ev.seq <= self.last_seq:
                return
            self.last_seq = ev.seq
            if isinstance(ev, ExecOutput):
                self.last_n = ev.payload.n
            self._push(ExecUpdate(ev, frame.text))
        elif isinstance(frame, frames.ExecEnd):
            self.close()
            self._push(None)
        elif isinstance(frame, frames.Error):
            self.close()
            self._push(error_from_frame(frame))

    def on_attach(self) -> bytes | None:
        return self.frame()

    def fail(self, error: AgoraError) -> None:
        self._push(error)

    async def updates(self) -> AsyncIterator[ExecUpdate]:
        try:
            while True:
                while not self.items:
                    self.wake.clear()
                    await self.wake.wait()
                item = self.items.popleft()
                if item is None:
                    return
                if isinstance(item, AgoraError):
                    raise item
                yield item
        finally:
            self.close()


class ExecHandle:
    """One execution: ``id``, its event stream (``async for update in handle``), ``result()``
    and ``kill()``.

    Single consumer (seed 003): read the stream *or* wait for ``result()``; the stream can be
    read once, not after ``result()``, and ``result()`` is refused while the stream is being
    read (after it ended, ``result()`` is fine). ``result()`` is memoised.
    """

    def __init__(self, runtime: WorkspaceRuntime, exec_id: str, resume: Any = "full") -> None:
        self.runtime = runtime
        self.id = exec_id
        self._resume = resume
        self._consumer: str | None = None
        self._streaming = False
        self._result: asyncio.Future[ExecResult] | None = None

    def __repr__(self) -> str:
        return f"ExecHandle({self.id!r}, workspace={self.runtime.workspace.name!r})"

    def __aiter__(self) -> AsyncIterator[ExecUpdate]:
        return self.events()

    async def events(self) -> AsyncIterator[ExecUpdate]:
        """The execution's events (per the handle's ``resume``: from ``execRequested`` for a
        new execution), live until ``execFinished``. Raises ``BadRequest`` (a second
        consumer), ``NotFound``, ``Busy`` (too many readers), or what ended the session."""
        if self._consumer is not None:
            raise BadRequest(
                f"execution {self.id!r} is already consumed by {self._consumer} (single consumer)"
            )
        self._consumer = "the event stream"
        session = self.runtime.workspace.session
        session._check_usable()
        rid = session._rid()
        follow = _ExecFollow(session, rid, self.runtime.workspace.name, self.id, self._resume)
        session._streams[rid] = follow
        session._send(follow.frame())
        self._streaming = True
        try:
            async for update in follow.updates():
                yield update
        finally:
            self._streaming = False

    async def result(self) -> ExecResult:
        """Wait for the execution to finish; its result (memoised). Raises ``BadRequest``
        while the stream is being read, ``NotFound``, or what ended the session."""
        if self._streaming:
            raise BadRequest(f"execution {self.id!r} is being read as a stream (single consumer)")
        if self._consumer is None:
            self._consumer = "result()"
        if self._result is None:
            self._result = asyncio.ensure_future(self._fetch())
        return await asyncio.shield(self._result)

    async def _fetch(self) -> ExecResult:
        ws = self.runtime.workspace
        reply = await ws.session.request(frames.ExecResultQuery(workspace=ws.name, exec_id=self.id))
        if not isinstance(reply, frames.ExecResult):
            raise Internal(f"unexpected reply to execResult: {type(reply).__name__}")
        return _exec_result(reply.result)

    async def kill(self) -> str:
        """Stop the execution; returns once it is recorded as finished, with its final status
        (a finished execution is left as it is). Raises ``NotFound``, ``Forbidden``."""
        ws = self.runtime.workspace
        reply = await ws.session.request(frames.Kill(workspace=ws.name, exec_id=self.id))
        if not isinstance(reply, frames.Killed):
            raise Internal(f"unexpected reply to kill: {type(reply).__name__}")
        return reply.status


class WorkspaceRuntime:
    """``ws.runtime``: run code in the workspace on the hub's backend instances."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def exec(
        self,
        source: str | None = None,
        *,
        backend: str | None = None,
        id: str | None = None,
        module: bytes | str | None = None,
        language: str | None = None,
        argv: Iterable[str] = (),
        stdin: bytes | str | None = None,
        input: Any = msgspec.UNSET,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        encoding: str = "utf8",
        policy: PolicyPatch | Mapping[str, Any] | None = None,
    ) -> ExecHandle:
        """Start an execution; returns its handle once the hub accepted it (``execRequested``
        is in the log). ``backend``: an instance id (default: the hub's first). ``id``: the
        execution id (default: a UUID). ``module``: WASM bytes, or the sha256 of a blob.
        ``input``: a JSON value for callable backends. ``encoding``: ``"utf8"`` (text) or
        ``"base64"`` (bytes) for the output. ``policy``: narrows the instance's policy.

        Raises ``Forbidden`` (no ``exec`` right, backend not in the token, a wider policy),
        ``NotFound`` (unknown backend), ``BadRequest`` (invalid, ``input`` on a non-callable
        backend), ``Busy`` (id running, the hub's cap), ``Exists`` (id retained: dispose it),
        ``Unavailable`` (backend unavailable; or the connection dropped before the answer).
        Not sent again after a reconnect (use ``get_exec(id)`` to find out).
        """
        session = self.workspace.session
        session._check_usable()
        exec_id = id if id is not None else str(uuid.uuid4())
        if isinstance(stdin, str):
            stdin = stdin.encode()
        mod: bytes | frames.ExecModuleBlob | None
        mod = frames.ExecModuleBlob(blob=module) if isinstance(module, str) else module
        patch = policy
        if patch is not None and not isinstance(patch, PolicyPatch):
            try:
                patch = msgspec.convert(dict(patch), PolicyPatch)
            except msgspec.ValidationError as e:
                raise BadRequest(f"invalid policy: {e}", field="policy") from e
        if encoding not in ("utf8", "base64"):
            raise BadRequest("encoding is 'utf8' or 'base64'", field="encoding")
        rid = session._rid()
        frame = frames.Exec(
            rid=rid,
            workspace=self.workspace.name,
            backend=backend,
            source=source,
            module=mod,
            exec_id=exec_id,
            language=language,
            argv=list(argv),
            stdin=stdin,
            input=input,
            env=dict(env or {}),
            cwd=cwd,
            timeout_ms=timeout_ms,
            encoding=cast(Any, encoding),
            policy=patch,
        )
        call = _ExecCall(session, rid, exec_id, _encoder.encode(frame))
        session._streams[rid] = call
        call.send()
        reply = await call.future
        if not isinstance(reply, frames.ExecAccepted):
            raise Internal(f"unexpected reply to exec: {type(reply).__name__}")
        return ExecHandle(self, reply.exec_id)

    def get_exec(self, id: str, *, resume: str | int = "full") -> ExecHandle:
        """A handle on an existing execution. Its stream starts per ``resume``: ``"full"``
        (from the first event, then live), ``"tail"`` (only new events) or ``n`` (after output
        ``n``). ``NotFound`` is raised when it is read."""
        return ExecHandle(self, id, resume)

    async def dispose_exec(self, id: str) -> None:
        """Free a finished execution's id and journal. Raises ``NotFound``, ``Busy`` (it is
        running), ``Forbidden``."""
        ws = self.workspace
        reply = await ws.session.request(frames.Dispose(workspace=ws.name, exec_id=id))
        if not isinstance(reply, frames.Disposed):
            raise Internal(f"unexpected reply to dispose: {type(reply).__name__}")
