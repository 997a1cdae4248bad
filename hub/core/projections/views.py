"""What the workspace fold reads of a stored event: one view Struct per kind. Pure.

Replaying a log decodes every stored event, and most of a stored event is what the workspace
fold never reads: the id, the workspace, the timestamp, ``prev`` and ``hash`` (two 64-character
strings), a message's text, an execution's source and output. Decoding a page into these views
instead of into :mod:`hub.core.events` skips building those strings (msgspec still parses,
and so checks the JSON syntax of, every byte), which makes decoding about five times cheaper;
:func:`hub.core.projections.workspace.fold_stored` folds them with the very handlers that fold
full events, so the state is the same (a Hypothesis property checks it).

A view declares exactly the fields its kind's handler reads, with the types, names and
defaults of :mod:`hub.core.events` (the payloads the fold reads whole are the events' own
payload Structs). Every kind has a view, so a kind this version does not know fails to decode
here as it does there. The other fields are not type-checked by this decoder: ``agora verify``
decodes every event in full and checks the hash chain.
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal

import msgspec

from hub.core.events import (
    ArtifactPayload,
    FileDeletedPayload,
    FileMovedPayload,
    FileWrittenPayload,
    MemberPayload,
)

__all__ = ["VIEWS", "EventView", "WorkView", "decode_views"]


# gc=False as for the events: views never form cycles, and a page of them must not make the
# garbage collector rescan it.
class EventView(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    tag_field="kind",
    gc=False,
):
    """The base of the views: the seq every fold advances to."""

    kind: ClassVar[str]

    seq: int = 0


class _ProducedView(EventView, frozen=True, kw_only=True):
    producer: str = ""


class WorkView(_ProducedView, frozen=True, kw_only=True):
    """The collaboration kinds: the envelope fields a work item is made of (no payload)."""

    consumer: str | None = None
    topic: str | None = None
    correlation_id: str | None = None


class NeedWorkView(WorkView, tag="needWork", frozen=True, kw_only=True):
    kind: ClassVar[str] = "needWork"


class WorkClaimedView(WorkView, tag="workClaimed", frozen=True, kw_only=True):
    kind: ClassVar[str] = "workClaimed"


class WorkPublishedView(WorkView, tag="workPublished", frozen=True, kw_only=True):
    kind: ClassVar[str] = "workPublished"


class FeedbackRequestedView(WorkView, tag="feedbackRequested", frozen=True, kw_only=True):
    kind: ClassVar[str] = "feedbackRequested"


class FeedbackProvidedView(WorkView, tag="feedbackProvided", frozen=True, kw_only=True):
    kind: ClassVar[str] = "feedbackProvided"


class BlockedView(WorkView, tag="blocked", frozen=True, kw_only=True):
    kind: ClassVar[str] = "blocked"


class CompletedView(WorkView, tag="completed", frozen=True, kw_only=True):
    kind: ClassVar[str] = "completed"


class WorkCancelledView(WorkView, tag="workCancelled", frozen=True, kw_only=True):
    kind: ClassVar[str] = "workCancelled"


class MessagePostedView(EventView, tag="messagePosted", frozen=True, kw_only=True):
    """Only counted: the text and data are never decoded."""

    kind: ClassVar[str] = "messagePosted"


class MemberJoinedView(EventView, tag="memberJoined", frozen=True, kw_only=True):
    kind: ClassVar[str] = "memberJoined"
    payload: MemberPayload


class MemberLeftView(EventView, tag="memberLeft", frozen=True, kw_only=True):
    kind: ClassVar[str] = "memberLeft"
    payload: MemberPayload


class FileWrittenView(_ProducedView, tag="fileWritten", frozen=True, kw_only=True):
    kind: ClassVar[str] = "fileWritten"
    payload: FileWrittenPayload


class FileDeletedView(EventView, tag="fileDeleted", frozen=True, kw_only=True):
    kind: ClassVar[str] = "fileDeleted"
    payload: FileDeletedPayload


class FileMovedView(_ProducedView, tag="fileMoved", frozen=True, kw_only=True):
    kind: ClassVar[str] = "fileMoved"
    payload: FileMovedPayload


class ArtifactPublishedView(_ProducedView, tag="artifactPublished", frozen=True, kw_only=True):
    kind: ClassVar[str] = "artifactPublished"
    payload: ArtifactPayload


class ExecBackendView(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """The payload of ``execRequested`` and ``execStarted`` as the fold reads it (not the
    source, argv, input or policy of a request)."""

    exec_id: str
    backend: str


class ExecOutcomeView(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """The payload of ``execFinished`` as the fold reads it (not the value, diagnostics or
    artifacts)."""

    exec_id: str
    status: Literal["completed", "failed", "cancelled"]
    reason: str
    exit_code: int = -1


class ExecIdView(msgspec.Struct, frozen=True, kw_only=True, rename="camel", gc=False):
    """The payload of ``execDisposed`` as the fold reads it."""

    exec_id: str


class ExecRequestedView(_ProducedView, tag="execRequested", frozen=True, kw_only=True):
    kind: ClassVar[str] = "execRequested"
    payload: ExecBackendView


class ExecCancelRequestedView(EventView, tag="execCancelRequested", frozen=True, kw_only=True):
    kind: ClassVar[str] = "execCancelRequested"


class ExecStartedView(EventView, tag="execStarted", frozen=True, kw_only=True):
    kind: ClassVar[str] = "execStarted"
    payload: ExecBackendView


class ExecOutputView(EventView, tag="execOutput", frozen=True, kw_only=True):
    """Only advances the seq: the output's bytes are never decoded."""

    kind: ClassVar[str] = "execOutput"


class ExecFinishedView(EventView, tag="execFinished", frozen=True, kw_only=True):
    kind: ClassVar[str] = "execFinished"
    payload: ExecOutcomeView


class ExecDisposedView(EventView, tag="execDisposed", frozen=True, kw_only=True):
    kind: ClassVar[str] = "execDisposed"
    payload: ExecIdView


class TokenRevokedView(EventView, tag="tokenRevoked", frozen=True, kw_only=True):
    kind: ClassVar[str] = "tokenRevoked"


class PushAttemptedView(EventView, tag="pushAttempted", frozen=True, kw_only=True):
    kind: ClassVar[str] = "pushAttempted"


AnyView = (
    NeedWorkView
    | WorkClaimedView
    | WorkPublishedView
    | FeedbackRequestedView
    | FeedbackProvidedView
    | BlockedView
    | CompletedView
    | WorkCancelledView
    | MessagePostedView
    | MemberJoinedView
    | MemberLeftView
    | FileWrittenView
    | FileDeletedView
    | FileMovedView
    | ArtifactPublishedView
    | ExecRequestedView
    | ExecCancelRequestedView
    | ExecStartedView
    | ExecOutputView
    | ExecFinishedView
    | ExecDisposedView
    | TokenRevokedView
    | PushAttemptedView
)

VIEWS: Final[dict[str, type[EventView]]] = {
    t.kind: t
    for t in (
        NeedWorkView,
        WorkClaimedView,
        WorkPublishedView,
        FeedbackRequestedView,
        FeedbackProvidedView,
        BlockedView,
        CompletedView,
        WorkCancelledView,
        MessagePostedView,
        MemberJoinedView,
        MemberLeftView,
        FileWrittenView,
        FileDeletedView,
        FileMovedView,
        ArtifactPublishedView,
        ExecRequestedView,
        ExecCancelRequestedView,
        ExecStartedView,
        ExecOutputView,
        ExecFinishedView,
        ExecDisposedView,
        TokenRevokedView,
        PushAttemptedView,
    )
}
"""kind → its view (the same kinds as :data:`hub.core.events.KINDS`; a test holds them equal)."""

_decoder: Final = msgspec.json.Decoder(list[AnyView])


def decode_views(data: bytes) -> list[EventView]:
    """Decode a JSON array of stored events into views, in one call. Raises
    ``msgspec.DecodeError`` (not JSON) or ``msgspec.ValidationError`` (an unknown kind, or a
    field the fold reads with the wrong type)."""
    return list(_decoder.decode(data))
