"""a2a_adapter.mapping and a2a_adapter.taskview: the round trip event → A2A → event, the
table's agreement with the projections, and the collisions kept apart."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from a2a.types.a2a_pb2 import TaskArtifactUpdateEvent, TaskState, TaskStatusUpdateEvent
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_adapter.mapping import (
    CROSSINGS,
    EXEC_STATE,
    KIND_KEY,
    WORK_STATE,
    MappingError,
    foreign_kind,
    from_a2a,
    message_payload,
    payload_parts,
    plain,
    task_id_of,
    to_a2a,
)
from a2a_adapter.taskview import TaskView
from hub.core.chain import seal
from hub.core.events import (
    Blocked,
    Event,
    ExecOutput,
    ExecOutputPayload,
    FeedbackProvided,
    FeedbackRequested,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkClaimed,
    WorkPublished,
)
from hub.core.projections.workspace import rebuild
from hub.core.rules.work import WORK_LIFECYCLE
from tests.strategies import valid_histories

S = TaskState

# JSON that survives a double: ints within ±2**53, finite non-integral floats.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)

parts = st.lists(
    st.one_of(
        st.builds(lambda t: {"text": t}, st.text(max_size=10)),
        st.builds(lambda d: {"data": d}, json_values),
        st.builds(lambda u: {"url": u, "mediaType": "text/html"}, st.text(min_size=1, max_size=10)),
        st.builds(
            lambda b, f: {"raw": b, "filename": f},
            st.binary(min_size=1, max_size=8).map(
                lambda b: json_format.MessageToDict(_raw_part(b))["raw"]
            ),
            st.text(min_size=1, max_size=5),
        ),
    ),
    min_size=1,
    max_size=3,
)


def _raw_part(data: bytes) -> Any:
    from a2a.types.a2a_pb2 import Part

    return Part(raw=data)


a2a_messages = st.builds(
    lambda mid, ps, meta: {"messageId": mid, "parts": ps, **({"metadata": meta} if meta else {})},
    st.text(min_size=1, max_size=8),
    parts,
    st.dictionaries(st.text(max_size=4), json_values, max_size=2),
)
a2a_artifacts = st.builds(
    lambda aid, ps, name, append, last: {
        "artifactId": aid,
        "parts": ps,
        **({"name": name} if name else {}),
        **({"append": True} if append else {}),
        **({"lastChunk": True} if last else {}),
    },
    st.text(min_size=1, max_size=8),
    parts,
    st.text(max_size=5),
    st.booleans(),
    st.booleans(),
)
payloads = st.one_of(json_values, a2a_messages, a2a_artifacts)


def round_trip(event: Event) -> list[Event]:
    out = []
    for update in to_a2a(event):
        back = from_a2a(update)
        if back is not None:
            out.append(back)
    return out


def assert_round_trip(event: Event) -> None:
    if event.kind not in CROSSINGS or not task_id_of(event):
        assert to_a2a(event) == []
        return
    assert round_trip(event) == [event]
    # The encoding is the same, byte for byte, except numbers a double cannot tell apart.
    back = round_trip(event)[0]
    assert plain(msgspec.to_builtins(back)) == plain(msgspec.to_builtins(event))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(valid_histories(max_size=40))
def test_every_mapped_event_round_trips(history: list[Event]) -> None:
    for event in history:
        assert_round_trip(event)


@settings(max_examples=300)
@given(
    st.sampled_from(
        [
            "needWork",
            "workClaimed",
            "workPublished",
            "feedbackRequested",
            "feedbackProvided",
            "blocked",
            "completed",
            "workCancelled",
        ]
    ),
    payloads,
    st.text(min_size=1, max_size=10),
    st.integers(1, 10_000),
    st.sampled_from(["alice", "peer-1"]),
    st.none() | st.text(min_size=1, max_size=6),
)
def test_collaboration_payloads_round_trip(
    kind: str, payload: Any, cid: str, seq: int, producer: str, consumer: str | None
) -> None:
    from hub.core.events import KINDS

    draft = KINDS[kind](  # type: ignore[call-arg]
        correlation_id=cid, consumer=consumer, payload=payload, id=f"e{seq}"
    )
    event = seal(
        draft,
        id=f"e{seq}",
        workspace="ws",
        seq=seq,
        position=seq,
        timestamp=1_700_000_000_000 + seq,
        producer=producer,
        prev="0" * 64,
    )
    assert_round_trip(event)


@settings(max_examples=200)
@given(
    st.none() | st.text(max_size=10), json_values | a2a_messages, st.none() | st.text(max_size=5)
)
def test_message_posted_round_trips(text: str | None, data: Any, media: str | None) -> None:
    event = MessagePosted(
        id="m1",
        workspace="ws",
        seq=3,
        producer="alice",
        correlation_id="t1",
        payload=MessagePayload(text=text, data=data, media_type=media),
    )
    assert_round_trip(event)


@given(st.binary(max_size=40), st.integers(1, 100), st.sampled_from(["stdout", "stderr"]))
def test_exec_output_round_trips(data: bytes, n: int, stream: str) -> None:
    event = ExecOutput(
        id="o1",
        workspace="ws",
        seq=n + 2,
        producer="hub",
        payload=ExecOutputPayload(exec_id="x1", stream=stream, n=n, data=data),  # type: ignore[arg-type]
    )
    assert_round_trip(event)


def test_a2a_message_payload_is_the_message_itself() -> None:
    payload = {"messageId": "m1", "parts": [{"text": "hello"}]}
    event = NeedWork(
        id="e1", workspace="ws", seq=1, producer="p", correlation_id="t", payload=payload
    )
    (update,) = to_a2a(event)
    assert isinstance(update, TaskStatusUpdateEvent)
    assert update.status.state == S.TASK_STATE_SUBMITTED
    assert update.status.message.message_id == "m1"
    assert update.status.message.parts[0].text == "hello"
    assert message_payload(update.status.message) == payload


def test_the_collisions_are_kept_apart() -> None:
    """The three places where two kinds land on one A2A shape."""
    base: dict[str, Any] = {"workspace": "ws", "producer": "bob", "correlation_id": "t"}
    # 1. feedbackRequested and blocked are both INPUT_REQUIRED.
    asked = to_a2a(FeedbackRequested(id="a", seq=2, payload="which?", **base))[0]
    stuck = to_a2a(Blocked(id="b", seq=3, payload="which?", **base))[0]
    assert isinstance(asked, TaskStatusUpdateEvent) and isinstance(stuck, TaskStatusUpdateEvent)
    assert asked.status.state == stuck.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert asked.metadata[KIND_KEY] == "feedbackRequested" and stuck.metadata[KIND_KEY] == "blocked"
    assert isinstance(from_a2a(asked), FeedbackRequested) and isinstance(from_a2a(stuck), Blocked)
    # 2. workClaimed, feedbackProvided and messagePosted are all WORKING.
    working = [
        to_a2a(WorkClaimed(id="c", seq=4, **base))[0],
        to_a2a(FeedbackProvided(id="d", seq=5, payload="x", **base))[0],
        to_a2a(MessagePosted(id="e", seq=6, payload=MessagePayload(text="x"), **base))[0],
    ]
    assert {u.status.state for u in working if isinstance(u, TaskStatusUpdateEvent)} == {
        S.TASK_STATE_WORKING
    }
    assert [type(from_a2a(u)) for u in working] == [WorkClaimed, FeedbackProvided, MessagePosted]
    # 3. workPublished and execOutput are both artifact updates.
    published = to_a2a(WorkPublished(id="f", seq=7, payload="result", **base))[0]
    output = to_a2a(
        ExecOutput(
            id="g",
            workspace="ws",
            seq=8,
            producer="hub",
            payload=ExecOutputPayload(exec_id="t", stream="stdout", n=1, data=b"result"),
        )
    )[0]
    assert isinstance(published, TaskArtifactUpdateEvent)
    assert isinstance(output, TaskArtifactUpdateEvent)
    assert isinstance(from_a2a(published), WorkPublished)
    assert isinstance(from_a2a(output), ExecOutput)


def test_table_agrees_with_the_work_lifecycle() -> None:
    for kind, crossing in CROSSINGS.items():
        if crossing.task != "work" or crossing.state is None:
            continue
        assert WORK_STATE[WORK_LIFECYCLE.table[None][kind]] == crossing.state, kind
    assert set(WORK_STATE) == {s for s in WORK_LIFECYCLE.table if s is not None}
    assert EXEC_STATE["failed"] == S.TASK_STATE_FAILED


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(valid_histories(max_size=40))
def test_task_view_state_is_the_projection_state(history: list[Event]) -> None:
    state = rebuild(history, "ws")
    for cid, item in state.work_items.items():
        view = TaskView(cid, "ws", "work")
        for ev in history:
            view.apply(ev)
        assert view.state == WORK_STATE[item.status]
        assert view.task().status.state == WORK_STATE[item.status]
    for exec_id, summary in state.executions.items():
        view = TaskView(exec_id, "ws", "exec")
        for ev in history:
            view.apply(ev)
        if not summary.disposed:
            assert view.state == EXEC_STATE[summary.status]


def test_foreign_updates() -> None:
    assert foreign_kind(S.TASK_STATE_WORKING, claimed=False, has_message=False) == "workClaimed"
    assert foreign_kind(S.TASK_STATE_WORKING, claimed=True, has_message=True) == "messagePosted"
    assert foreign_kind(S.TASK_STATE_WORKING, claimed=True, has_message=False) is None
    assert foreign_kind(S.TASK_STATE_SUBMITTED, claimed=False, has_message=True) is None
    assert foreign_kind(S.TASK_STATE_FAILED, claimed=True, has_message=False) == "workCancelled"


def test_update_without_agora_metadata_is_refused() -> None:
    with pytest.raises(MappingError):
        from_a2a(TaskStatusUpdateEvent(task_id="t", context_id="c"))


def test_payload_parts_for_peers() -> None:
    parts, meta = payload_parts({"messageId": "m", "parts": [{"text": "hi"}]})
    assert [p.text for p in parts] == ["hi"] and meta is None
    parts, _ = payload_parts("plain")
    assert parts[0].text == "plain"
    parts, _ = payload_parts({"spec": 1})
    assert json_format.MessageToDict(parts[0])["data"] == {"spec": 1.0}


def test_docs_show_the_current_tables() -> None:
    from pathlib import Path

    from a2a_adapter.mapping import foreign_table, mapping_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "a2a.md").read_text()
    assert mapping_table() in doc, "docs/a2a.md: regenerate the mapping table"
    assert foreign_table() in doc, "docs/a2a.md: regenerate the bridge table"
