"""Wire frames of the WebSocket protocol ``agora.v1`` (contract: ARCHITECTURE.md "Wire protocol").

Pure. JSON text frames, camelCase. Every frame is tagged by ``op``; client frames may carry a
``rid`` that the reply repeats. Inbound client frames forbid unknown fields (a typo is a
``badRequest`` naming it); server frames are read leniently by the client so the server can
grow fields. Documented in docs/protocol.md; JSON Schema in schemas/protocol.json.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final

import msgspec

from hub.events import AnyEvent

Rid = str | int | None
Seq = Annotated[int, msgspec.Meta(ge=0)]

SUBPROTOCOL: Final = "agora.v1"


class ClientFrame(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    tag_field="op",
    forbid_unknown_fields=True,
):
    rid: Rid = None


class Hello(ClientFrame, tag="hello", frozen=True):
    token: str


class Subscribe(ClientFrame, tag="subscribe", frozen=True):
    """Catch up on every event with ``seq > afterSeq`` then follow live; omitted = live only."""

    workspace: str
    after_seq: Seq | None = None


class Unsubscribe(ClientFrame, tag="unsubscribe", frozen=True):
    workspace: str


class Publish(ClientFrame, tag="publish", frozen=True):
    """One event (``event``) or an atomic batch (``events``), never both."""

    workspace: str
    event: AnyEvent | None = None
    events: list[AnyEvent] | None = None
    expected_seq: Seq | None = None


class GetState(ClientFrame, tag="state", frozen=True):
    workspace: str
    at_seq: Seq | None = None


AnyClientFrame = Hello | Subscribe | Unsubscribe | Publish | GetState


class ServerFrame(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    tag_field="op",
):
    rid: Rid = None


class Welcome(ServerFrame, tag="welcome", frozen=True):
    agent: str
    rights: list[str]
    server: str
    workspaces: list[str] = []
    backends: list[str] = []
    expires_at: int = 0


class Subscribed(ServerFrame, tag="subscribed", frozen=True):
    workspace: str
    head: int


class Unsubscribed(ServerFrame, tag="unsubscribed", frozen=True):
    workspace: str


class EventFrame(ServerFrame, tag="event", frozen=True):
    """``event`` holds the stored JSON as is (``msgspec.Raw`` on the server side)."""

    workspace: str
    event: Annotated[
        Any, msgspec.Meta(description="The stored event (schemas/events.json), as stored.")
    ]


class Ack(ServerFrame, tag="ack", frozen=True, kw_only=True):
    """Single publish: ``seq``/``id``; batch: ``seqs``/``ids``. ``duplicate``: a retry.

    ``duplicate`` has no default so that it is always on the wire, ``false`` included."""

    workspace: str
    seq: int | None = None
    id: str | None = None
    seqs: list[int] | None = None
    ids: list[str] | None = None
    duplicate: bool


class StateFrame(ServerFrame, tag="state", frozen=True):
    workspace: str
    seq: int
    state: Annotated[
        Any, msgspec.Meta(description="The workspace state (schemas/workspace-state.json).")
    ]


class Error(ServerFrame, tag="error", frozen=True, kw_only=True):
    """``details`` has no default so that it is always on the wire, ``{}`` included."""

    code: str
    message: str
    details: dict[str, Any]


AnyServerFrame = Welcome | Subscribed | Unsubscribed | EventFrame | Ack | StateFrame | Error


class CloseCode(enum.IntEnum):
    """WebSocket close codes Agora uses (RFC 6455 §7.4 plus the 4xxx private range)."""

    SHUTDOWN = 1001  # going away: the hub is stopping
    POLICY = 1008  # abuse: too many bad frames
    TOO_BIG = 1009  # a frame over the size limit
    INTERNAL = 1011
    UNAUTHORIZED = 4401  # no valid token, or it expired
    TOO_SLOW = 4408  # send queue overflowed; resume with afterSeq
