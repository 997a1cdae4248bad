"""Hypothesis strategies for valid event histories of one workspace (reusable across tests).

- :func:`valid_drafts` — ``list[Draft]``: ``(producer, draft)`` pairs in append order, where
  each draft passes :func:`hub.core.validation.validate_draft` and :func:`hub.core.rules.decide`
  against the state of the drafts before it, and respects the work-item and execution
  lifecycles. Hub-only kinds (presence, ``execStarted``/``Output``/``Finished``/``Disposed``)
  are produced by :data:`HUB`; ``execRequested``/``execCancelRequested`` by agents (through the
  ``exec``/``kill`` ops). Filter with ``hub.core.events.HUB_KINDS``/``OP_KINDS`` to get what a
  client may ``publish``. ``fileWritten`` drafts carry no ``sha256``/``size`` (the hub fills
  them).
- :func:`valid_histories` — ``list[Event]``: the same, sealed with :func:`hub.core.chain.seal`
  (seq 1.., ids ``"<workspace>-<seq>"``, ``sha256``/``size`` filled as the hub would).
- :func:`seal_all` — seal a list of drafts yourself.

The model here is deliberately independent of :mod:`hub.core.projections` (it tracks file revs,
work-item owners and execution phases itself), so tests can use it to check the projections.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from hypothesis import strategies as st

from hub.core.chain import seal
from hub.core.events import (
    ArtifactPayload,
    ArtifactPublished,
    Blocked,
    Completed,
    Event,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
    ExecDisposed,
    ExecDisposedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileDeletedPayload,
    FileMoved,
    FileMovedPayload,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberLeft,
    MemberPayload,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)

__all__ = [
    "AGENTS",
    "HUB",
    "PATHS",
    "Draft",
    "file_content",
    "seal_all",
    "valid_drafts",
    "valid_histories",
]

AGENTS: tuple[str, ...] = ("alice", "bob", "carol")
HUB = "hub"
PATHS: tuple[str, ...] = ("README.md", "src/main.py", "src/util.py", "docs/guide.md", "data.bin")
BASE_TIMESTAMP = 1_712_000_000_000

Draft = tuple[str, Event]
"""(producer, draft)."""

_COLLAB: dict[str, Callable[..., Event]] = {
    "needWork": NeedWork,
    "workClaimed": WorkClaimed,
    "workPublished": WorkPublished,
    "feedbackRequested": FeedbackRequested,
    "feedbackProvided": FeedbackProvided,
    "blocked": Blocked,
    "completed": Completed,
    "workCancelled": WorkCancelled,
}

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
_text = st.text(max_size=24)


@dataclass
class _Item:
    requester: str
    owner: str | None = None
    terminal: bool = False


@dataclass
class _Exec:
    phase: str  # requested | running | finished | disposed
    outputs: int = 0


@dataclass
class _Model:
    files: dict[str, int] = field(default_factory=dict)  # path -> rev
    items: dict[str, _Item] = field(default_factory=dict)
    execs: dict[str, _Exec] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


def file_content(p: FileWrittenPayload) -> bytes | None:
    """The bytes an inline ``fileWritten`` payload carries (None for a blob reference)."""
    if p.text is not None:
        return p.text.encode()
    if p.base64 is not None:
        return base64.b64decode(p.base64)
    return None


@st.composite
def _write(draw: st.DrawFn, m: _Model) -> Draft:
    path = draw(st.sampled_from(PATHS))
    rev = m.files.get(path, 0)
    base_rev = draw(st.sampled_from([None, rev]))
    source = draw(st.sampled_from(["text", "base64", "blob"]))
    kw: dict[str, Any] = {}
    if source == "text":
        kw["text"] = draw(_text)
    elif source == "base64":
        kw["base64"] = base64.b64encode(draw(st.binary(max_size=24))).decode()
    else:
        blob = draw(st.binary(min_size=1, max_size=24))
        kw["blob"] = hashlib.sha256(blob).hexdigest()
        kw["size"] = 65 * 1024 + len(blob)
    m.files[path] = rev + 1
    producer = draw(st.sampled_from(AGENTS))
    return producer, FileWritten(payload=FileWrittenPayload(path=path, base_rev=base_rev, **kw))


@st.composite
def _delete(draw: st.DrawFn, m: _Model) -> Draft:
    path = draw(st.sampled_from(sorted(m.files)))
    base_rev = draw(st.sampled_from([None, m.files.pop(path)]))
    producer = draw(st.sampled_from(AGENTS))
    return producer, FileDeleted(payload=FileDeletedPayload(path=path, base_rev=base_rev))


@st.composite
def _move(draw: st.DrawFn, m: _Model) -> Draft:
    src = draw(st.sampled_from(sorted(m.files)))
    free = [p for p in PATHS if p not in m.files]
    use_free = bool(free) and draw(st.booleans())
    dst = draw(st.sampled_from(free)) if use_free else m.fresh("moved/f")
    rev = m.files.pop(src)
    m.files[dst] = rev + 1
    base_rev = draw(st.sampled_from([None, rev]))
    producer = draw(st.sampled_from(AGENTS))
    return producer, FileMoved(payload=FileMovedPayload(from_=src, to=dst, base_rev=base_rev))


def _may_send(item: _Item, kind: str) -> list[str]:
    """Agents the decide rules let send ``kind`` on ``item``."""
    if kind in ("workClaimed", "workPublished", "completed") and item.owner is not None:
        return [item.owner]
    if kind == "workCancelled":
        return sorted({item.requester} | ({item.owner} if item.owner else set()))
    return list(AGENTS)


def _apply(m: _Model, cid: str, kind: str, producer: str) -> None:
    item = m.items.get(cid)
    if item is None:
        item = m.items[cid] = _Item(requester=producer)
    if kind == "workClaimed":
        item.owner = producer
    if kind in ("completed", "workCancelled"):
        item.terminal = True


@st.composite
def _collab(draw: st.DrawFn, m: _Model, mode: str) -> Draft:
    cid: str | None
    if mode == "open":  # a new item, usually with needWork, sometimes implicitly
        cid = m.fresh("work-")
        kind = draw(st.sampled_from(["needWork", "needWork", *_COLLAB]))
        producer = draw(st.sampled_from(AGENTS))
    elif mode == "continue":
        cid = draw(st.sampled_from(sorted(c for c, i in m.items.items() if not i.terminal)))
        kind = draw(st.sampled_from(list(_COLLAB)))
        producer = draw(st.sampled_from(_may_send(m.items[cid], kind)))
    else:  # no correlationId: touches no work item
        cid = None
        kind = draw(st.sampled_from(list(_COLLAB)))
        producer = draw(st.sampled_from(AGENTS))
    if cid is not None:
        _apply(m, cid, kind, producer)
    consumer = draw(st.none() | st.sampled_from(AGENTS))
    topic = draw(st.none() | st.sampled_from(["build", "review", "docs"]))
    payload = draw(_json)
    return producer, _COLLAB[kind](
        correlation_id=cid, consumer=consumer, topic=topic, payload=payload
    )


@st.composite
def _message(draw: st.DrawFn, m: _Model) -> Draft:
    payload = MessagePayload(
        text=draw(st.none() | _text),
        data=draw(_json),
        media_type=draw(st.none() | st.just("text/plain")),
    )
    return draw(st.sampled_from(AGENTS)), MessagePosted(payload=payload)


@st.composite
def _presence(draw: st.DrawFn, m: _Model, join: bool) -> Draft:
    if join:
        agent = draw(st.sampled_from([a for a in AGENTS if a not in m.present]))
        m.present.add(agent)
        via = draw(st.sampled_from(["websocket", "a2a"]))
        card = f"https://agents.example/{agent}.json" if via == "a2a" else None
        return HUB, MemberJoined(payload=MemberPayload(agent=agent, via=via, card_url=card))
    agent = draw(st.sampled_from(sorted(m.present)))
    m.present.discard(agent)
    return HUB, MemberLeft(payload=MemberPayload(agent=agent, reason="closed"))


@st.composite
def _artifact(draw: st.DrawFn, m: _Model) -> Draft:
    data = draw(st.binary(max_size=16))
    digest = hashlib.sha256(data).hexdigest()
    exec_id = draw(st.none() | st.sampled_from(sorted(m.execs) or ["x1"]))
    payload = ArtifactPayload(
        key=draw(st.sampled_from(["report", "build/out.wasm", "plot.png"])),
        media_type="application/octet-stream",
        size_bytes=len(data),
        sha256=digest,
        blob=digest,
        exec_id=exec_id,
    )
    return draw(st.sampled_from(AGENTS)), ArtifactPublished(payload=payload)


def _execs_in(m: _Model, *phases: str) -> list[str]:
    return sorted(i for i, e in m.execs.items() if e.phase in phases)


@st.composite
def _exec(draw: st.DrawFn, m: _Model, step: str) -> Draft:
    if step == "request":
        reuse = _execs_in(m, "disposed")
        reused = bool(reuse) and draw(st.booleans())
        exec_id = draw(st.sampled_from(reuse)) if reused else m.fresh("x")
        m.execs[exec_id] = _Exec("requested")
        payload = ExecRequestedPayload(
            exec_id=exec_id,
            backend=draw(st.sampled_from(["process", "wasm", "python"])),
            language="python",
            source=draw(_text),
            argv=draw(st.lists(st.text(max_size=5), max_size=2)),
            stdin=draw(st.none() | st.binary(max_size=8)),
            input=draw(_json),
            timeout_ms=draw(st.none() | st.integers(1, 60_000)),
        )
        return draw(st.sampled_from(AGENTS)), ExecRequested(payload=payload)
    if step == "cancel":
        exec_id = draw(st.sampled_from(_execs_in(m, "requested", "running")))
        payload_c = ExecCancelRequestedPayload(exec_id=exec_id, reason="kill")
        return draw(st.sampled_from(AGENTS)), ExecCancelRequested(payload=payload_c)
    if step == "start":
        exec_id = draw(st.sampled_from(_execs_in(m, "requested")))
        m.execs[exec_id].phase = "running"
        return HUB, ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="process"))
    if step == "output":
        exec_id = draw(st.sampled_from(_execs_in(m, "running")))
        rec = m.execs[exec_id]
        rec.outputs += 1
        payload_o = ExecOutputPayload(
            exec_id=exec_id,
            stream=draw(st.sampled_from(["stdout", "stderr"])),
            n=rec.outputs,
            data=draw(st.binary(min_size=1, max_size=16)),
        )
        return HUB, ExecOutput(payload=payload_o)
    if step == "finish":
        exec_id = draw(st.sampled_from(_execs_in(m, "requested", "running")))
        m.execs[exec_id].phase = "finished"
        outcomes: list[tuple[Literal["completed", "failed", "cancelled"], str, int]] = [
            ("completed", "exit", 0),
            ("failed", "exit", 1),
            ("failed", "timeout", -1),
            ("cancelled", "killed", 130),
        ]
        status, reason, code = draw(st.sampled_from(outcomes))
        payload_f = ExecFinishedPayload(
            exec_id=exec_id,
            status=status,
            reason=reason,
            exit_code=code,
            value=draw(_json),
            duration_ms=draw(st.integers(0, 10_000)),
        )
        return HUB, ExecFinished(payload=payload_f)
    exec_id = draw(st.sampled_from(_execs_in(m, "finished")))
    m.execs[exec_id].phase = "disposed"
    return HUB, ExecDisposed(payload=ExecDisposedPayload(exec_id=exec_id))


def _steps(m: _Model) -> list[tuple[str, ...]]:
    """The moves possible in the model's current state (each a strategy name + args)."""
    steps: list[tuple[str, ...]] = [("message",), ("write",), ("write",), ("collab", "open")]
    steps.append(("collab", "none"))
    steps.append(("artifact",))
    steps.append(("exec", "request"))
    if m.files:
        steps += [("delete",), ("move",)]
    if any(not i.terminal for i in m.items.values()):
        steps += [("collab", "continue")] * 3
    if len(m.present) < len(AGENTS):
        steps.append(("join",))
    if m.present:
        steps.append(("leave",))
    if _execs_in(m, "requested", "running"):
        steps += [("exec", "cancel"), ("exec", "finish")]
    if _execs_in(m, "requested"):
        steps.append(("exec", "start"))
    if _execs_in(m, "running"):
        steps += [("exec", "output")] * 2
    if _execs_in(m, "finished"):
        steps.append(("exec", "dispose"))
    return steps


@st.composite
def valid_drafts(draw: st.DrawFn, max_size: int = 30, min_size: int = 0) -> list[Draft]:
    """A valid sequence of ``(producer, draft)`` for one empty workspace (see module doc)."""
    m = _Model()
    size = draw(st.integers(min_size, max_size))
    out: list[Draft] = []
    for _ in range(size):
        step = draw(st.sampled_from(_steps(m)))
        match step:
            case ("message",):
                out.append(draw(_message(m)))
            case ("write",):
                out.append(draw(_write(m)))
            case ("delete",):
                out.append(draw(_delete(m)))
            case ("move",):
                out.append(draw(_move(m)))
            case ("collab", mode):
                out.append(draw(_collab(m, mode)))
            case ("artifact",):
                out.append(draw(_artifact(m)))
            case ("join",):
                out.append(draw(_presence(m, True)))
            case ("leave",):
                out.append(draw(_presence(m, False)))
            case ("exec", what):
                out.append(draw(_exec(m, what)))
            case _:
                raise AssertionError(step)
    return out


def seal_all(
    drafts: Sequence[Draft], workspace: str = "ws", *, after_seq: int = 0, prev: str = ""
) -> list[Event]:
    """Seal ``drafts`` as the hub would: seq/id/position/timestamp/prev/hash, and
    ``sha256``/``size`` of inline ``fileWritten`` content."""
    out: list[Event] = []
    for i, (producer, draft) in enumerate(drafts, start=after_seq + 1):
        if isinstance(draft, FileWritten):
            p = draft.payload
            data = file_content(p)
            filled = (
                msgspec.structs.replace(p, sha256=p.blob)
                if data is None
                else msgspec.structs.replace(
                    p, sha256=hashlib.sha256(data).hexdigest(), size=len(data)
                )
            )
            draft = msgspec.structs.replace(draft, payload=filled)
        ev = seal(
            draft,
            id=f"{workspace}-{i}",
            workspace=workspace,
            seq=i,
            position=i,
            timestamp=BASE_TIMESTAMP + i,
            producer=producer,
            prev=prev,
        )
        prev = ev.hash or ""
        out.append(ev)
    return out


def valid_histories(
    max_size: int = 30, workspace: str = "ws", min_size: int = 0
) -> st.SearchStrategy[list[Event]]:
    """Sealed valid histories of one workspace, seq 1.. (see module doc)."""
    return valid_drafts(max_size=max_size, min_size=min_size).map(
        lambda drafts: seal_all(drafts, workspace)
    )
