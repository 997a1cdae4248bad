"""The human timeline of a workspace log, as ``agora replay`` prints it. Pure: no I/O.

One line per event::

    2024-05-01T12:00:00.123Z  seq 17  agent-a  fileWritten  src/app.py rev 3 (1.2 KiB)

:func:`summarize` gives the kind-specific part; :class:`Timeline` folds the workspace
projection alongside (to know, e.g., a file's revision after a write) and formats whole lines.
Everything user-controlled (paths, ids, payload text) is made single-line and printable, so a
crafted event can neither break the one-line-per-event layout nor send terminal escapes.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any, Final

import msgspec

from hub.core.events import (
    COLLABORATION_KINDS,
    ArtifactPublished,
    Event,
    ExecCancelRequested,
    ExecDisposed,
    ExecFinished,
    ExecOutput,
    ExecRequested,
    ExecStarted,
    FileDeleted,
    FileMoved,
    FileWritten,
    MemberJoined,
    MemberLeft,
    MessagePosted,
    PushAttempted,
    TokenRevoked,
)
from hub.core.projections.workspace import WorkspaceState, evolve

__all__ = [
    "Timeline",
    "format_line",
    "format_size",
    "format_time",
    "parse_time",
    "printable",
    "summarize",
]

# Longest quoted excerpt of free text (payload text, source code) in a summary.
EXCERPT_CHARS: Final = 60
# Payload fields that usually carry the human description of a collaboration event.
_TEXT_KEYS: Final = ("title", "summary", "description", "text", "message", "reason", "task")
_UTC: Final = dt.UTC
_json: Final = msgspec.json.Encoder()


def format_time(ms: int) -> str:
    """Epoch milliseconds as UTC ISO 8601 with milliseconds: ``2024-05-01T12:00:00.123Z``."""
    return f"{_second(ms // 1000)}.{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=256)
def _second(seconds: int) -> str:
    # Cached: a replay formats runs of events stamped in the same second.
    try:
        return dt.datetime.fromtimestamp(seconds, _UTC).strftime("%Y-%m-%dT%H:%M:%S")
    except (ValueError, OverflowError, OSError):  # beyond year 1..9999: show the number
        return f"@{seconds}"


def parse_time(text: str) -> int:
    """ISO 8601 (``2024-05-01``, ``2024-05-01T12:00``, ``...Z``, ``...+02:00``) as epoch ms.

    A time without an offset is UTC. Raises :class:`ValueError` naming the text.
    """
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use ISO 8601, e.g. 2024-05-01T12:00:00Z"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_UTC)
    delta = stamp - dt.datetime(1970, 1, 1, tzinfo=_UTC)
    return delta // dt.timedelta(milliseconds=1)


def format_size(n: int) -> str:
    """Bytes in binary units, one decimal: ``512 B``, ``1.2 KiB``, ``3.0 MiB``; ``? B`` if < 0."""
    if n < 0:
        return "? B"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def printable(text: str) -> str:
    """One printable line: non-printable characters (newline, ESC, ...) become escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _quote(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A double-quoted, single-line excerpt of at most ``limit`` characters (``…`` if cut)."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return '"' + printable(flat).replace('"', '\\"') + '"'


def _describe(payload: Any) -> str | None:
    """A short quoted description of a free-form (adk-code style) payload, or None if empty."""
    if payload is None or payload == {} or payload == []:
        return None
    if isinstance(payload, str):
        return _quote(payload)
    if isinstance(payload, dict):
        for key in _TEXT_KEYS:
            value = payload.get(key)
            if isinstance(value, str) and value:
                return _quote(value)
    try:
        return _quote(_json.encode(payload).decode())
    except (TypeError, msgspec.EncodeError):  # pragma: no cover - payloads come from JSON
        return _quote(repr(payload))


def _links(ev: Event) -> list[str]:
    """``#correlation``, topic and ``→ consumer``, where present."""
    parts = []
    if ev.correlation_id is not None:
        parts.append("#" + printable(ev.correlation_id))
    if ev.topic is not None:
        parts.append(printable(ev.topic))
    if ev.consumer is not None:
        parts.append("→ " + printable(ev.consumer))
    return parts


def summarize(ev: Event, rev: int | None = None) -> str:
    """The kind-specific one-line summary (without time, seq, producer or kind).

    ``rev`` is the file revision after a ``fileWritten``/``fileMoved`` when the caller knows it
    (see :class:`Timeline`); it is left out otherwise.
    """
    rev_part = f" rev {rev}" if rev is not None else ""
    match ev:
        case FileWritten(payload=p):
            size = p.size
            if size is None:
                size = len(p.text.encode("utf-8", "surrogatepass")) if p.text is not None else -1
            where = ", blob" if p.blob is not None else ""
            return f"{printable(p.path)}{rev_part} ({format_size(size)}{where})"
        case FileDeleted(payload=p):
            return printable(p.path)
        case FileMoved(payload=p):
            return f"{printable(p.from_)} → {printable(p.to)}{rev_part}"
        case ArtifactPublished(payload=p):
            text = f"{printable(p.key)} {printable(p.media_type)} ({format_size(p.size_bytes)})"
            return text + (f" exec {printable(p.exec_id)}" if p.exec_id is not None else "")
        case MessagePosted(payload=p):
            parts = _links(ev)
            if p.text is not None:
                parts.append(_quote(p.text))
            elif p.data is not None:
                parts.append("data " + (_describe(p.data) or "{}"))
            return " ".join(parts)
        case MemberJoined(payload=p):
            return f"{printable(p.agent)} via {printable(p.via)}"
        case MemberLeft(payload=p):
            reason = f" ({printable(p.reason)})" if p.reason is not None else ""
            return f"{printable(p.agent)}{reason}"
        case ExecRequested(payload=p):
            text = f"{printable(p.exec_id)} on {printable(p.backend)}"
            if p.language is not None:
                text += f" {printable(p.language)}"
            if p.source is not None:
                text += " " + _quote(p.source)
            elif p.module is not None:
                text += f" module {p.module.blob[:12]}"
            if p.argv:
                text += " argv " + _quote(" ".join(p.argv))
            return text
        case ExecCancelRequested(payload=p):
            reason = f" ({printable(p.reason)})" if p.reason is not None else ""
            return f"{printable(p.exec_id)}{reason}"
        case ExecStarted(payload=p):
            isolation = f" ({printable(p.isolation)})" if p.isolation is not None else ""
            return f"{printable(p.exec_id)} on {printable(p.backend)}{isolation}"
        case ExecOutput(payload=p):
            return f"{printable(p.exec_id)} {p.stream} #{p.n} ({format_size(len(p.data))})"
        case ExecFinished(payload=p):
            reason = f" {printable(p.reason)}" if p.reason != "exit" else ""
            return (
                f"{printable(p.exec_id)} {p.status}{reason} exit {p.exit_code} ({p.duration_ms} ms)"
            )
        case ExecDisposed(payload=p):
            return printable(p.exec_id)
        case PushAttempted(payload=p):
            status = f" HTTP {p.status}" if p.status is not None else ""
            error = f" {_quote(p.error)}" if p.error else ""
            return (
                f"task {printable(p.task_id)} {p.state} (seq {p.seq}) to {printable(p.url)}: "
                f"{p.outcome}{status}, attempt {p.attempt}{error}"
            )
        case TokenRevoked(payload=p):
            parts = []
            if p.token_id is not None:
                parts.append(f"token {printable(p.token_id)}")
            if p.agent is not None:
                before = (
                    f" issued by {format_time(p.before * 1000)}" if p.before is not None else ""
                )
                parts.append(f"every token of {printable(p.agent)}{before}")
            if p.reason:
                parts.append(_quote(p.reason))
            return " ".join(parts)
        case _ if ev.kind in COLLABORATION_KINDS:
            parts = _links(ev)
            described = _describe(getattr(ev, "payload", None))
            if described is not None:
                parts.append(described)
            return " ".join(parts)
        case _:  # pragma: no cover - every kind is matched above
            return ""


def format_line(ev: Event, rev: int | None = None) -> str:
    """``time  seq N  producer  kind  summary`` for one stored event."""
    summary = summarize(ev, rev)
    line = f"{format_time(ev.timestamp)}  seq {ev.seq}  {printable(ev.producer) or '-'}  {ev.kind}"
    return f"{line}  {summary}" if summary else line


class Timeline:
    """Formats a workspace's events in seq order, folding its projection alongside.

    Start from the state just before the first event to format (an empty
    :class:`WorkspaceState` for the whole log); the fold is what knows a file's revision.
    """

    def __init__(self, state: WorkspaceState) -> None:
        self.state = state

    def line(self, ev: Event) -> str:
        """Fold ``ev`` into the state and return its timeline line."""
        evolve(self.state, ev)
        rev: int | None = None
        if isinstance(ev, FileWritten | FileMoved):
            path = ev.payload.path if isinstance(ev, FileWritten) else ev.payload.to
            entry = self.state.files.get(path)
            rev = entry.rev if entry is not None else None
        return format_line(ev, rev)
