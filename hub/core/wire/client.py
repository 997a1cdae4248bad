"""The client side of ``agora.v1`` without I/O (sans-I/O, like ``websockets.protocol.Protocol``).

The server's counterpart is :mod:`hub.core.wire.session`. A :class:`ClientProtocol` is fed every
frame that arrived (:meth:`ClientProtocol.receive`) and hands back what it means, as one
:data:`Incoming` value; the asyncio shell (:mod:`hub.client.session`) writes the bytes that
:meth:`ClientProtocol.request` returns and acts on what :meth:`~ClientProtocol.receive` says.
It owns:

- **rids and reply matching**: requests get increasing integer ``rid``\\ s; a reply is matched to
  the handler registered under its rid (once for a one-shot request; a subscription or an
  execution stream keeps its rid until an ``error`` ends it or the shell forgets it);
- **lenient decoding**: any bytes from the hub become an :data:`Incoming` value — a frame of an
  unknown shape carrying a pending rid fails that request with
  :class:`~hub.core.errors.Internal`, anything else unreadable is :class:`Dropped`; nothing but
  :class:`~hub.core.errors.AgoraError` is ever raised;
- **the resume cursor per workspace** (:class:`ResumeCursor`): the seq of the last event seen;
  an event at or below it is a duplicate (dropped), one beyond the next seq is a gap (the shell
  resubscribes from the cursor, docs/protocol.md "Resuming");
- **fatal closes**: :func:`close_error` says which close codes reconnecting cannot help with
  (:data:`hub.core.errors.FATAL_CLOSES`), and which error they become.

It imports no asyncio and no websockets (import-linter enforces it), so it is tested with plain
values (tests/hub/core/wire/test_client.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import msgspec

from hub.core.cursor import SeqCursor, Step
from hub.core.errors import FATAL_CLOSES, AgoraError, Internal, Unauthorized, error_class
from hub.core.errors import is_known_code as _is_known_code
from hub.core.events import AnyEvent, Event
from hub.core.wire.frames import AnyServerFrame, ClientFrame, Error, EventFrame, ServerFrame

__all__ = [
    "ClientProtocol",
    "Dropped",
    "EventIn",
    "Garbled",
    "Incoming",
    "Notice",
    "Refused",
    "Reply",
    "ResumeCursor",
    "close_error",
    "decode_frame",
    "encode_frame",
    "error_from_frame",
    "event_of",
]

H = TypeVar("H")

_frame_decoder: Final = msgspec.json.Decoder(AnyServerFrame)
_encoder: Final = msgspec.json.Encoder()


# ---------------------------------------------------------------------------------------------
# Errors: read from the one table in hub.core.errors


def error_from_frame(frame: Error) -> AgoraError:
    """The :mod:`hub.core.errors` exception an ``error`` frame stands for (unknown codes:
    :class:`~hub.core.errors.Internal`, with the code kept in ``details['code']``).

    Read from :data:`hub.core.errors.ERROR_TABLE`; ``details`` is kept as sent.
    """
    error = error_class(frame.code)(frame.message)
    error.details = dict(frame.details)
    if not _is_known_code(frame.code):
        error.details.setdefault("code", frame.code)
    return error


def close_error(code: int | None, reason: str) -> AgoraError | None:
    """The error to raise for a close code after which reconnecting cannot help (4401, 1008,
    1009: :data:`hub.core.errors.FATAL_CLOSES`), or None when a reconnect may help."""
    cls = FATAL_CLOSES.get(code or 0)
    if cls is None:
        return None
    return cls(f"the hub closed the connection ({code}: {reason or 'no reason'})", closeCode=code)


# ---------------------------------------------------------------------------------------------
# Frames


def encode_frame(frame: ClientFrame, rid: int | None = None) -> bytes:
    """The JSON of client ``frame``, with ``rid`` set when given."""
    if rid is not None:
        frame = msgspec.structs.replace(frame, rid=rid)
    return _encoder.encode(frame)


def decode_frame(raw: str | bytes) -> ServerFrame:
    """One server frame, strictly (the ``hello`` exchange). Raises
    :class:`~hub.core.errors.Internal` for anything that is not a known frame."""
    try:
        frame: ServerFrame = _frame_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Internal(f"bad frame from the hub: {e}") from e
    return frame


def event_of(obj: Any) -> Event | None:
    """A typed event from the decoded JSON of an ``event`` frame; None for a kind (or shape)
    this client does not know (a newer hub)."""
    try:
        ev: Event = msgspec.convert(obj, AnyEvent)
    except msgspec.ValidationError:
        return None
    return ev


def _seq_of(obj: Any) -> int | None:
    seq = obj.get("seq") if isinstance(obj, dict) else None
    # bool is an int to Python, not a seq to anyone.
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


# ---------------------------------------------------------------------------------------------
# The resume cursor


class ResumeCursor(SeqCursor):
    """The seq of the last event seen in one workspace (or one execution stream): the shared
    :class:`hub.core.cursor.SeqCursor`, plus whether the subscription is confirmed.

    :meth:`observe` advances it by one event at a time, so what it lets through never repeats
    and never skips: an event at or below ``position`` is a duplicate, one beyond
    ``position + 1`` a gap. ``contiguous=False`` (an execution's stream, whose events are
    scattered over the workspace's seqs) lets any later seq through and never reports a gap.
    """

    __slots__ = ("contiguous", "started")

    def __init__(self, position: int = 0, *, started: bool = False, contiguous: bool = True):
        super().__init__(position)
        self.started = started
        self.contiguous = contiguous

    @property
    def position(self) -> int:
        return self.last

    def __repr__(self) -> str:
        return f"ResumeCursor(position={self.last}, started={self.started})"

    def restart(self, after: int) -> None:
        """A subscribe from ``afterSeq = after`` was confirmed: the next event is ``after + 1``."""
        self.last = after
        self.started = True

    def observe(self, seq: int) -> Step:
        """Judge the event at ``seq``; advance to it when it is :data:`Step.NEXT`."""
        if not self.started:
            return Step.UNSTARTED
        step = self.step(seq)
        if step is Step.GAP and not self.contiguous:
            step = Step.NEXT
        if step is Step.NEXT:
            self.advance(seq)
        return step


# ---------------------------------------------------------------------------------------------
# What a received frame means


@dataclass(frozen=True, slots=True)
class Reply(Generic[H]):
    """A frame answering the request registered under ``rid`` (never an ``error``)."""

    rid: int
    handler: H
    frame: ServerFrame


@dataclass(frozen=True, slots=True)
class Refused(Generic[H]):
    """An ``error`` frame for the request registered under ``rid``; it is forgotten."""

    rid: int
    handler: H
    error: AgoraError


@dataclass(frozen=True, slots=True)
class Garbled(Generic[H]):
    """A frame of a shape this client cannot read, carrying the pending ``rid`` (a newer hub,
    or a broken one). A one-shot request is forgotten."""

    rid: int
    handler: H
    error: Internal


@dataclass(frozen=True, slots=True)
class EventIn:
    """An ``event`` frame of a tracked workspace, judged by its :class:`ResumeCursor`.
    ``event`` is decoded only for :attr:`Step.NEXT` (None then too for an unknown kind:
    its seq still counts). ``size``: the frame's bytes as received."""

    workspace: str
    seq: int
    verdict: Step
    event: Event | None
    size: int


@dataclass(frozen=True, slots=True)
class Notice:
    """An ``error`` frame answering no pending request. ``fatal``: the session's token is no
    longer valid (the hub closes with 4401 next)."""

    error: AgoraError
    fatal: bool


@dataclass(frozen=True, slots=True)
class Dropped:
    """Nothing to act on: ``reason`` says why (for the log)."""

    reason: str


Incoming = Reply[H] | Refused[H] | Garbled[H] | EventIn | Notice | Dropped
"""What :meth:`ClientProtocol.receive` makes of one frame."""


@dataclass(slots=True)
class _Expected(Generic[H]):
    handler: H
    once: bool


class ClientProtocol(Generic[H]):
    """The client's protocol state for one session (across its connections): rids, the
    requests awaiting replies (each with a ``handler`` of the shell's own type ``H``), and a
    :class:`ResumeCursor` per followed workspace."""

    def __init__(self) -> None:
        self._last_rid = 0
        self._expected: dict[int, _Expected[H]] = {}
        self._cursors: dict[str, ResumeCursor] = {}

    # -- requests -------------------------------------------------------------------------

    def next_rid(self) -> int:
        """A fresh rid (1, 2, …; ``hello`` on connect uses 0)."""
        self._last_rid += 1
        return self._last_rid

    def request(self, frame: ClientFrame, handler: H, *, once: bool = True) -> tuple[int, bytes]:
        """Register ``handler`` for the reply to ``frame`` under a fresh rid; the rid and the
        bytes to send. ``once``: the first reply ends the request; otherwise (a subscription,
        an execution stream) it stays until an ``error`` or :meth:`forget`."""
        rid = self.next_rid()
        self.expect(rid, handler, once=once)
        return rid, encode_frame(frame, rid)

    def expect(self, rid: int, handler: H, *, once: bool = True) -> None:
        """Route replies carrying ``rid`` to ``handler`` (see :meth:`request`)."""
        self._expected[rid] = _Expected(handler, once)

    def forget(self, rid: int) -> H | None:
        """Stop routing ``rid``; its handler, or None if none was registered."""
        expected = self._expected.pop(rid, None)
        return expected.handler if expected is not None else None

    def handler(self, rid: int) -> H | None:
        expected = self._expected.get(rid)
        return expected.handler if expected is not None else None

    def pending(self) -> list[tuple[int, H]]:
        """Every registered request, oldest first."""
        return [(rid, e.handler) for rid, e in self._expected.items()]

    # -- resume cursors -------------------------------------------------------------------

    def track(self, workspace: str) -> ResumeCursor:
        """Start (afresh) following ``workspace``'s events; its cursor."""
        cursor = self._cursors[workspace] = ResumeCursor()
        return cursor

    def untrack(self, workspace: str, cursor: ResumeCursor | None = None) -> None:
        """Stop following ``workspace`` (only if its cursor is still ``cursor``, when given)."""
        if cursor is None or self._cursors.get(workspace) is cursor:
            self._cursors.pop(workspace, None)

    def cursor(self, workspace: str) -> ResumeCursor | None:
        return self._cursors.get(workspace)

    # -- frames ---------------------------------------------------------------------------

    def receive(self, raw: str | bytes) -> Incoming[H]:
        """What the frame ``raw`` means. Never raises: the hub's bytes cannot break the client."""
        try:
            frame: ServerFrame = _frame_decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return self._garbled(raw, e)
        if isinstance(frame, EventFrame):
            return self._event(frame, len(raw))
        rid = frame.rid
        expected = None
        if isinstance(rid, int) and not isinstance(rid, bool):
            expected = self._expected.get(rid)
        if isinstance(frame, Error):
            error = error_from_frame(frame)
            if expected is None:
                return Notice(error, fatal=isinstance(error, Unauthorized))
            assert isinstance(rid, int)
            del self._expected[rid]
            return Refused(rid, expected.handler, error)
        if expected is None:
            return Dropped(f"a {type(frame).__name__} reply to no pending request ({rid!r})")
        assert isinstance(rid, int)
        if expected.once:
            del self._expected[rid]
        return Reply(rid, expected.handler, frame)

    def _event(self, frame: EventFrame, size: int) -> EventIn | Dropped:
        cursor = self._cursors.get(frame.workspace)
        if cursor is None:
            return Dropped(f"an event of workspace {frame.workspace!r}, which is not followed")
        seq = _seq_of(frame.event)
        if seq is None:
            return Dropped(f"an event without a seq in workspace {frame.workspace!r}")
        verdict = cursor.observe(seq)
        event = event_of(frame.event) if verdict is Step.NEXT else None
        return EventIn(frame.workspace, seq, verdict, event, size)

    def _garbled(self, raw: str | bytes, error: Exception) -> Garbled[H] | Dropped:
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return Dropped(f"an undecodable frame: {error}")
        rid = obj.get("rid") if isinstance(obj, dict) else None
        if not isinstance(rid, int) or isinstance(rid, bool) or rid not in self._expected:
            return Dropped(f"a frame of an unknown shape: {error}")
        expected = self._expected[rid]
        if expected.once:
            del self._expected[rid]
        return Garbled(rid, expected.handler, Internal(f"unexpected reply from the hub: {error}"))
