"""The pure protocol session (hub.core.wire.session), tested with plain values: no sockets, no
loop."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.capability import Capability
from hub.core.errors import BadRequest, Conflict, Forbidden, Unauthorized, Unavailable
from hub.core.events import FileWritten, FileWrittenPayload, MessagePosted, encode_event
from hub.core.projections.workspace import WorkspaceState
from hub.core.records import AppendResult
from hub.core.wire.frames import (
    Ack,
    Error,
    EventFrame,
    StateFrame,
    Subscribed,
    Unsubscribed,
    Welcome,
)
from hub.core.wire.session import (
    MAX_CLOSE_REASON_BYTES,
    Close,
    PublishRequest,
    Send,
    ServerSession,
    SessionLimits,
    StateRequest,
    SubscribeRequest,
    TokenBucket,
    UnsubscribeRequest,
    bearer_token,
    encode_ack,
    encode_event_frame,
    encode_frame,
    error_frame,
    overflow_reason,
    parse_overflow_reason,
)

NOW = 1_800_000_000.0


def capability(
    agent: str = "alice",
    workspaces: tuple[str, ...] = ("*",),
    rights: tuple[Any, ...] = ("read", "write"),
    expires_at: int = int(NOW) + 3600,
) -> Capability:
    return Capability(
        agent=agent,
        workspaces=workspaces,
        rights=rights,
        expires_at=expires_at,
        issued_at=int(NOW),
        token_id="t",
    )


TOKENS = {
    "good": capability(),
    "bob": capability("bob"),
    "reader": capability("reader", ("w",), ("read",)),
    "writer": capability("writer", ("w",), ("write",)),
    "short": capability("alice", expires_at=int(NOW) + 10),
}


def verify(token: str) -> Capability:
    try:
        return TOKENS[token]
    except KeyError:
        raise Unauthorized("token signature is invalid", reason="invalid_signature") from None


class Clocks:
    def __init__(self) -> None:
        self.wall = NOW
        self.mono = 100.0


def session(token: str | None = "good", **limits: Any) -> tuple[ServerSession, Clocks]:
    clocks = Clocks()
    s = ServerSession(
        verify,
        limits=SessionLimits(**limits),
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.mono,
        server="agora/test",
    )
    if token is not None:
        [reply] = s.receive(json.dumps({"op": "hello", "token": token}))
        assert isinstance(reply, Send) and isinstance(reply.frame, Welcome)
    return s, clocks


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def only_error(actions: list[Any]) -> Error:
    [action] = actions
    assert isinstance(action, Send) and isinstance(action.frame, Error), actions
    return action.frame


def closes(actions: list[Any]) -> tuple[Error, Close]:
    send, close = actions
    assert isinstance(send, Send) and isinstance(send.frame, Error)
    assert isinstance(close, Close)
    return send.frame, close


MSG = {"kind": "messagePosted", "payload": {"text": "hi"}}

# -- authentication ----------------------------------------------------------------------------


def test_hello_gets_welcome_with_rid() -> None:
    s, _ = session(None)
    [reply] = s.receive(frame(op="hello", rid="r1", token="reader"))
    assert reply == Send(
        Welcome(
            rid="r1",
            agent="reader",
            rights=["read"],
            server="agora/test",
            workspaces=["w"],
            backends=[],
            expires_at=int(NOW) + 3600,
        )
    )
    assert s.agent == "reader"


def test_bearer_header_authenticates_on_open() -> None:
    s, _ = session(None)
    [reply] = s.open("Bearer good")
    assert isinstance(reply, Send) and isinstance(reply.frame, Welcome)
    assert reply.frame.rid is None and s.agent == "alice"


@pytest.mark.parametrize("header", ["Bearer nope", "Basic Zm9vOmJhcg==", "Bearer", ""])
def test_bad_header_is_unauthorized_4401(header: str) -> None:
    s, _ = session(None)
    error, close = closes(s.open(header))
    assert error.code == "unauthorized" and close.code == 4401
    assert s.receive(frame(op="hello", token="good")) == []  # closed: nothing more


def test_no_header_waits_for_hello() -> None:
    s, _ = session(None)
    assert s.open(None) == []


@pytest.mark.parametrize(
    "first",
    [frame(op="state", rid=3, workspace="w"), "{garbage", frame(op="hello")],
)
def test_first_frame_not_a_valid_hello_is_4401(first: str) -> None:
    s, _ = session(None)
    error, close = closes(s.receive(first))
    assert error.code == "unauthorized" and close.code == 4401
    assert close.reason.startswith("unauthorized")


def test_binary_before_hello_is_4401() -> None:
    s, _ = session(None)
    error, close = closes(s.receive_binary(b"{}"))
    assert error.code == "unauthorized" and close.code == 4401


def test_forged_hello_is_4401_with_reason() -> None:
    s, _ = session(None)
    error, close = closes(s.receive(frame(op="hello", rid=1, token="forged")))
    assert error.details == {"reason": "invalid_signature"} and error.rid == 1
    assert close == Close(4401, "unauthorized: invalid_signature")


def test_expiry_is_checked_on_every_frame() -> None:
    s, clocks = session("short")
    assert isinstance(s.receive(frame(op="state", workspace="w"))[0], StateRequest)
    clocks.wall += 10
    error, close = closes(s.receive(frame(op="state", rid=5, workspace="w")))
    assert error.code == "unauthorized" and error.details["reason"] == "expired"
    assert error.rid == 5 and close.code == 4401


def test_second_hello_refreshes_only_the_same_agent() -> None:
    s, _ = session("short")
    [welcome] = s.receive(frame(op="hello", token="good"))
    assert isinstance(welcome, Send) and isinstance(welcome.frame, Welcome)
    assert s.capability is TOKENS["good"]
    error = only_error(s.receive(frame(op="hello", token="bob")))
    assert error.code == "forbidden" and s.agent == "alice"


def test_refresh_cannot_drop_a_subscribed_workspace() -> None:
    s, _ = session(None)
    s.receive(frame(op="hello", token="good"))
    s.receive(frame(op="subscribe", workspace="elsewhere"))
    TOKENS["narrow"] = capability("alice", ("w",))
    try:
        error = only_error(s.receive(frame(op="hello", token="narrow")))
    finally:
        del TOKENS["narrow"]
    assert error.code == "forbidden" and error.details["workspaces"] == ["elsewhere"]


# -- rights ------------------------------------------------------------------------------------


def test_rights() -> None:
    reader, _ = session("reader")
    assert isinstance(reader.receive(frame(op="subscribe", workspace="w"))[0], SubscribeRequest)
    error = only_error(reader.receive(frame(op="publish", workspace="w", event=MSG)))
    assert error.code == "forbidden" and error.details["right"] == "write"
    error = only_error(reader.receive(frame(op="state", workspace="other")))
    assert error.code == "forbidden" and error.details["workspace"] == "other"

    writer, _ = session("writer")
    for op in ("subscribe", "state"):
        error = only_error(writer.receive(frame(op=op, workspace="w")))
        assert error.code == "forbidden" and error.details["right"] == "read"
    assert isinstance(
        writer.receive(frame(op="publish", workspace="w", event=MSG))[0], PublishRequest
    )


# -- subscriptions -----------------------------------------------------------------------------


def test_subscription_bookkeeping() -> None:
    s, _ = session(max_subscriptions=2)
    [req] = s.receive(frame(op="subscribe", rid=1, workspace="a", afterSeq=4))
    assert req == SubscribeRequest(rid=1, workspace="a", after_seq=4)
    assert only_error(s.receive(frame(op="subscribe", workspace="a"))).code == "exists"
    [req2] = s.receive(frame(op="subscribe", workspace="b"))
    assert req2 == SubscribeRequest(rid=None, workspace="b", after_seq=None)
    busy = only_error(s.receive(frame(op="subscribe", workspace="c")))
    assert busy.code == "busy" and busy.details["limit"] == 2
    [unsub] = s.receive(frame(op="unsubscribe", rid=2, workspace="a"))
    assert unsub == UnsubscribeRequest(rid=2, workspace="a")
    assert s.subscriptions == {"b"}
    missing = only_error(s.receive(frame(op="unsubscribe", workspace="a")))
    assert missing.code == "notFound" and missing.details["field"] == "$.workspace"
    [done] = s.completed(unsub, None)
    assert done == Send(Unsubscribed(rid=2, workspace="a"))


def test_subscribed_and_failed_subscribe() -> None:
    s, _ = session()
    [req] = s.receive(frame(op="subscribe", rid=7, workspace="a"))
    assert isinstance(req, SubscribeRequest)
    assert s.completed(req, 12) == [Send(Subscribed(rid=7, workspace="a", head=12))]
    [req] = s.receive(frame(op="subscribe", rid=8, workspace="b"))
    assert isinstance(req, SubscribeRequest)
    error = only_error(s.failed(req, Unavailable("store down")))
    assert error.code == "unavailable" and error.rid == 8
    assert "b" not in s.subscriptions


def test_invalid_workspace_name() -> None:
    s, _ = session()
    error = only_error(s.receive(frame(op="subscribe", workspace="../x")))
    assert error.code == "badRequest" and error.details["field"] == "$.workspace"


# -- publish -----------------------------------------------------------------------------------


def test_publish_single_and_batch() -> None:
    s, _ = session()
    [single] = s.receive(frame(op="publish", rid=1, workspace="w", event=MSG, expectedSeq=3))
    assert isinstance(single, PublishRequest)
    assert (single.agent, single.batch, single.expected_seq) == ("alice", False, 3)
    assert isinstance(single.events[0], MessagePosted)
    [batch] = s.receive(frame(op="publish", workspace="w", events=[MSG, MSG]))
    assert isinstance(batch, PublishRequest) and batch.batch and len(batch.events) == 2


def test_ack_frames() -> None:
    s, _ = session()
    [single] = s.receive(frame(op="publish", rid=1, workspace="w", event=MSG))
    [batch] = s.receive(frame(op="publish", rid=2, workspace="w", events=[MSG, MSG]))
    assert isinstance(single, PublishRequest) and isinstance(batch, PublishRequest)
    stored = tuple(
        MessagePosted(id=f"e{i}", workspace="w", seq=i, producer="alice") for i in (5, 6)
    )
    [ack] = s.completed(single, AppendResult(workspace="w", events=stored[:1]))
    assert ack == Send(Ack(rid=1, workspace="w", seq=5, id="e5", duplicate=False))
    [ack] = s.completed(batch, AppendResult(workspace="w", events=stored, duplicate=True))
    assert ack == Send(Ack(rid=2, workspace="w", seqs=[5, 6], ids=["e5", "e6"], duplicate=True))
    assert (
        json.loads(encode_frame(Ack(workspace="w", seq=1, id="x", duplicate=False)))["duplicate"]
        is False
    )


def test_encode_ack_is_the_completed_frame() -> None:
    # The shell's hot path encodes a publish's ack straight to bytes: the very frame
    # completed answers with.
    s, _ = session()
    [single] = s.receive(frame(op="publish", rid="r1", workspace="w", event=MSG))
    [batch] = s.receive(frame(op="publish", rid=2, workspace="w", events=[MSG, MSG]))
    stored = tuple(
        MessagePosted(id=f"e{i}", workspace="w", seq=i, producer="alice") for i in (5, 6)
    )
    for request, result in (
        (single, AppendResult(workspace="w", events=stored[:1])),
        (batch, AppendResult(workspace="w", events=stored, duplicate=True)),
    ):
        [ack] = s.completed(request, result)
        assert isinstance(ack, Send)
        assert encode_ack(request, result) == encode_frame(ack.frame)


def test_a_new_token_is_checked_again_before_a_publish() -> None:
    # The session remembers where its token may write; a refreshed token that may not
    # write there any more is refused at once.
    s, _ = session("good")
    assert isinstance(s.receive(frame(op="publish", workspace="w", event=MSG))[0], PublishRequest)
    TOKENS["read-only"] = capability("alice", rights=("read",))
    try:
        [welcome] = s.receive(frame(op="hello", token="read-only"))
    finally:
        del TOKENS["read-only"]
    assert isinstance(welcome, Send) and isinstance(welcome.frame, Welcome)
    error = only_error(s.receive(frame(op="publish", workspace="w", event=MSG)))
    assert error.code == "forbidden" and error.details["right"] == "write"


def test_many_workspaces_stay_checked() -> None:
    # The remembered workspaces are bounded: past the bound each is checked again, and
    # still refused or accepted as before.
    s, _ = session("writer")
    for i in range(150):
        error = only_error(s.receive(frame(op="publish", workspace=f"w{i}", event=MSG)))
        assert error.code == "forbidden"
        [request] = s.receive(frame(op="publish", workspace="w", event=MSG))
        assert isinstance(request, PublishRequest)


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({}, "badRequest", "$.event"),
        ({"event": MSG, "events": [MSG]}, "badRequest", "$.events"),
        ({"events": []}, "badRequest", "$.events"),
        ({"events": [MSG] * 4}, "tooLarge", "$.events"),
    ],
)
def test_publish_shape_errors(fields: dict[str, Any], code: str, field: str) -> None:
    s, _ = session(max_batch_events=3)
    error = only_error(s.receive(frame(op="publish", workspace="w", **fields)))
    assert (error.code, error.details["field"]) == (code, field)


def test_rate_limit_counts_events_with_retry_hint() -> None:
    s, clocks = session(publish_rate=10.0, publish_burst=5)
    assert isinstance(
        s.receive(frame(op="publish", workspace="w", events=[MSG] * 5))[0], PublishRequest
    )
    error = only_error(s.receive(frame(op="publish", workspace="w", events=[MSG] * 2)))
    assert error.code == "rateLimited" and error.details["retryAfterMs"] == 200
    clocks.mono += 0.2
    assert isinstance(
        s.receive(frame(op="publish", workspace="w", events=[MSG] * 2))[0], PublishRequest
    )
    error = only_error(s.receive(frame(op="publish", workspace="w", events=[MSG] * 6)))
    assert error.code == "tooLarge"  # above the burst: can never pass


def test_publish_failure_names_the_field_in_the_frame() -> None:
    s, _ = session()
    [single] = s.receive(frame(op="publish", workspace="w", event=MSG))
    [batch] = s.receive(frame(op="publish", workspace="w", events=[MSG, MSG]))
    assert isinstance(single, PublishRequest) and isinstance(batch, PublishRequest)
    error = only_error(s.failed(single, BadRequest("bad", field="payload.path", index=0)))
    assert error.details["field"] == "$.event.payload.path"
    error = only_error(s.failed(batch, BadRequest("bad", field="payload.path", index=1)))
    assert error.details["field"] == "$.events[1].payload.path"
    error = only_error(s.failed(batch, Conflict("stale", head=9, expectedSeq=3)))
    assert error.code == "conflict" and error.details == {"head": 9, "expectedSeq": 3}


def test_state_request_and_frame() -> None:
    s, _ = session()
    [req] = s.receive(frame(op="state", rid=4, workspace="w", atSeq=2))
    assert req == StateRequest(rid=4, workspace="w", at_seq=2)
    state = WorkspaceState(workspace="w", seq=2)
    [reply] = s.completed(req, state)
    assert reply == Send(StateFrame(rid=4, workspace="w", seq=2, state=state))
    body = json.loads(encode_frame(StateFrame(rid=4, workspace="w", seq=2, state=state)))
    assert body["state"]["seq"] == 2


# -- bad frames --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ("{nope", "$"),
        ("[]", "$"),
        ('"text"', "$"),
        (frame(op="bogus"), "$.op"),
        (frame(workspace="w"), "$.op"),
        (frame(op="subscribe"), "$.workspace"),
        (frame(op="subscribe", workspace="w", afterSeq="1"), "$.afterSeq"),
        (frame(op="subscribe", workspace="w", afterSeq=-1), "$.afterSeq"),
        (frame(op="subscribe", workspace="w", extra=1), "$.extra"),
        (frame(op="publish", workspace="w", event={"kind": "x"}), "$.event.kind"),
        (
            frame(op="publish", workspace="w", event={"kind": "fileWritten", "payload": {}}),
            "$.event.payload.path",
        ),
        (
            frame(op="publish", workspace="w", events=[MSG, {"kind": "fileDeleted"}]),
            "$.events[1].payload",
        ),
    ],
)
def test_decode_errors_name_the_field(raw: str, field: str) -> None:
    s, _ = session()
    error = only_error(s.receive(raw))
    assert error.code == "badRequest" and error.details["field"] == field, error
    assert s.bad_frames == 1


def test_rid_is_recovered_from_a_frame_that_failed_to_validate() -> None:
    s, _ = session()
    assert only_error(s.receive(frame(op="bogus", rid="x1"))).rid == "x1"


def test_garbage_flood_closes_1008_and_good_frames_do_not_count() -> None:
    s, _ = session(garbage_limit=3)
    assert only_error(s.receive("x")).code == "badRequest"
    assert only_error(s.receive_binary(b"\x00")).code == "badRequest"
    assert isinstance(s.receive(frame(op="state", workspace="w"))[0], StateRequest)
    error = only_error(s.receive(frame(op="publish", workspace="w")))  # not garbage: a request
    assert error.code == "badRequest" and s.bad_frames == 2
    error, close = closes(s.receive("y"))
    assert close.code == 1008 and s.closed == close
    assert s.receive(frame(op="state", workspace="w")) == []


# -- errors → frames ---------------------------------------------------------------------------


def test_error_mapping() -> None:
    assert error_frame(Forbidden("no", right="write"), 3) == Error(
        rid=3, code="forbidden", message="no", details={"right": "write"}
    )
    internal = error_frame(RuntimeError("secret detail"))
    assert internal.code == "internal" and internal.details == {}
    assert "secret" not in internal.message
    odd = error_frame(BadRequest("x", value=object()))
    json.loads(encode_frame(odd))  # details are always JSON-safe


def test_unexpected_failure_is_internal_and_keeps_the_connection() -> None:
    s, _ = session()
    [req] = s.receive(frame(op="state", rid=1, workspace="w"))
    assert isinstance(req, StateRequest)
    error = only_error(s.failed(req, KeyError("boom")))
    assert (error.code, error.details, error.rid) == ("internal", {}, 1)
    assert s.closed is None


def test_unauthorized_from_a_request_closes_4401() -> None:
    s, _ = session()
    [req] = s.receive(frame(op="state", workspace="w"))
    assert isinstance(req, StateRequest)
    _, close = closes(s.failed(req, Unauthorized("revoked", reason="revoked")))
    assert close.code == 4401


# -- encodings ---------------------------------------------------------------------------------


def test_event_frame_embeds_the_stored_bytes() -> None:
    ev = FileWritten(
        id="e1", workspace="w", seq=3, producer="a", payload=FileWrittenPayload(path="a", text="x")
    )
    stored = encode_event(ev)
    data = encode_event_frame("w", stored)
    assert data == encode_frame(EventFrame(workspace="w", event=ev))
    assert json.loads(data) == {"op": "event", "workspace": "w", "event": json.loads(stored)}


def test_overflow_reason_fits_and_round_trips() -> None:
    reason = overflow_reason({"a": 3, "bb": 12})
    assert reason == '{"lastSeq":{"a":3,"bb":12}}'
    assert parse_overflow_reason(reason) == {"a": 3, "bb": 12}
    many = {f"workspace-{i}": 10**9 + i for i in range(20)}
    reason = overflow_reason(many)
    assert len(reason.encode()) <= MAX_CLOSE_REASON_BYTES
    assert json.loads(reason)["partial"] is True
    kept = parse_overflow_reason(reason)
    assert kept and all(many[w] == s for w, s in kept.items())
    with pytest.raises(ValueError):
        parse_overflow_reason("too slow")


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True), st.integers(0, 2**53), max_size=30
    )
)
def test_overflow_reason_always_fits(last: dict[str, int]) -> None:
    reason = overflow_reason(last)
    assert len(reason.encode()) <= MAX_CLOSE_REASON_BYTES
    kept = parse_overflow_reason(reason)
    assert all(last[w] == s for w, s in kept.items())
    assert ("partial" in json.loads(reason)) == (len(kept) < len(last))


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(4.0, 8, lambda: now[0])
    assert bucket.take(8) == 0.0
    assert bucket.take(1) == pytest.approx(0.25)
    now[0] += 0.5
    assert bucket.take(2) == 0.0
    assert bucket.take(9) == float("inf")
    now[0] += 100
    assert bucket.take(8) == 0.0  # capped at the burst


def test_bearer_token() -> None:
    assert bearer_token(None) is None
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") == ""


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)), st.booleans())
def test_any_input_gets_actions_never_an_exception(data: str | bytes, binary: bool) -> None:
    s, _ = session()
    if binary:
        actions = s.receive_binary(data if isinstance(data, bytes) else data.encode())
    else:
        actions = s.receive(data)
    assert actions
    for action in actions:
        if isinstance(action, Send):
            msgspec.json.decode(encode_frame(action.frame))


@settings(max_examples=200)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    st.sampled_from(["hello", "subscribe", "unsubscribe", "publish", "state"]),
)
def test_random_json_frames_get_a_reply(body: Any, op: str) -> None:
    s, _ = session()
    doc = dict(body) if isinstance(body, dict) else {"value": body}
    doc["op"] = op
    actions = s.receive(json.dumps(doc))
    assert actions


def test_expiry_wins_over_a_bad_frame() -> None:
    s, clocks = session("short")
    clocks.wall += 10
    error, close = closes(s.receive('{"op": "bogus", "rid": 3}'))
    assert error.code == "unauthorized" and error.rid == 3 and close.code == 4401
    s, clocks = session("short")
    clocks.wall += 10
    error, close = closes(s.receive_binary(b"x"))
    assert error.details["reason"] == "expired" and close.code == 4401


def test_too_slow_close_names_subscribed_workspaces_only() -> None:
    s, _ = session()
    s.receive(frame(op="subscribe", workspace="a"))
    close = s.too_slow({"a": 7, "gone": 3})
    assert close == Close(4408, '{"lastSeq":{"a":7}}') and s.closed == close
    assert s.receive(frame(op="state", workspace="a")) == []


# -- nesting depth (issue 11: a deep frame must be a typed refusal, never an exception) --------


def _deep(levels: int) -> str:
    return '{"op":"publish","rid":9,"workspace":"w","event":{"kind":"messagePosted","payload":' + (
        '{"data":' + "[" * levels + "]" * levels + "}}}"
    )


@pytest.mark.parametrize("levels", [100, 5000, 200_000])
def test_a_frame_nested_too_deep_before_hello_is_refused_not_raised(levels: int) -> None:
    s, _ = session(None)
    error, close = closes(s.receive(_deep(levels)))
    assert error.code == "unauthorized" and close.code == 4401


@pytest.mark.parametrize("levels", [100, 5000, 200_000])
def test_a_frame_nested_too_deep_is_bad_request_naming_the_limit(levels: int) -> None:
    s, _ = session()
    error = only_error(s.receive(_deep(levels)))
    assert error.code == "badRequest"
    assert error.details["limit"] == 64 and error.details["field"] == "$"
    assert s.closed is None  # a request error never closes the connection


def test_the_depth_limit_is_a_session_limit() -> None:
    s, _ = session(max_depth=8)
    error = only_error(s.receive(_deep(6)))
    assert error.code == "badRequest" and error.details["limit"] == 8
    s, _ = session()
    actions = s.receive(_deep(6))  # within the default: decoded and handed on as a request
    assert not any(isinstance(a, Send) and isinstance(a.frame, Error) for a in actions)


@settings(max_examples=200)
@given(
    st.integers(0, 3000),
    st.sampled_from(["[", '{"a":', '[{"b":']),
    st.text(alphabet='[]{}",:\\ax1', max_size=40),
    st.booleans(),
)
def test_any_nesting_gets_actions_never_an_exception(
    depth: int, opener: str, tail: str, authenticated: bool
) -> None:
    s, _ = session("good" if authenticated else None)
    closer = {"[": "]", '{"a":': "}", '[{"b":': "}]"}[opener]
    text = '{"op":"publish","rid":1,"workspace":"w","event":' + opener * depth + tail
    actions = s.receive(text + closer * depth + "}")
    assert actions
    for action in actions:
        if isinstance(action, Send):
            msgspec.json.decode(encode_frame(action.frame))
