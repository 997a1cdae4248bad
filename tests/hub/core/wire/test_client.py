"""hub/core/wire/client.py: the client side of ``agora.v1`` without I/O, with plain values.

The asyncio shell (hub/client/) is tested against a real hub in tests/hub/client/; here every
frame is bytes built by hand, and Hypothesis throws arbitrary bytes and arbitrary event streams
at the protocol.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.cursor import Step
from hub.core.errors import (
    ERROR_TABLE,
    FATAL_CLOSES,
    AgoraError,
    BadRequest,
    CloseCode,
    Conflict,
    Internal,
    TooLarge,
    Unauthorized,
)
from hub.core.events import MessagePayload, MessagePosted
from hub.core.wire import frames
from hub.core.wire.client import (
    ClientProtocol,
    Dropped,
    EventIn,
    Garbled,
    Notice,
    Refused,
    Reply,
    ResumeCursor,
    close_error,
    decode_frame,
    encode_frame,
    error_from_frame,
)


def raw(frame: frames.ServerFrame) -> bytes:
    return msgspec.json.encode(frame)


def event_frame(workspace: str, seq: int, kind: str = "messagePosted") -> bytes:
    ev = msgspec.to_builtins(
        MessagePosted(id=f"e{seq}", seq=seq, workspace=workspace, payload=MessagePayload(text="x"))
    )
    ev["kind"] = kind
    return raw(frames.EventFrame(workspace=workspace, event=ev))


# ---------------------------------------------------------------------------------------------
# Encoding, decoding, errors


def test_encode_sets_the_rid_and_decode_is_strict() -> None:
    data = encode_frame(frames.Subscribe(workspace="w", after_seq=3), 7)
    assert msgspec.json.decode(data) == {
        "op": "subscribe",
        "workspace": "w",
        "afterSeq": 3,
        "rid": 7,
    }
    assert b'"rid"' not in encode_frame(frames.Unsubscribe(workspace="w"))
    assert isinstance(
        decode_frame(raw(frames.Subscribed(rid=1, workspace="w", head=2))), frames.Subscribed
    )
    for garbage in (b"", b"{", b'{"op": "nope"}', b"[1]", b'{"op": "subscribed"}'):
        with pytest.raises(Internal):
            decode_frame(garbage)


@pytest.mark.parametrize("row", ERROR_TABLE, ids=lambda row: row.code)
def test_every_wire_code_becomes_its_class(row: Any) -> None:
    error = error_from_frame(frames.Error(code=row.code, message="m", details={"head": 3}))
    assert type(error) is row.error
    assert error.details == {"head": 3} and error.message == "m"


def test_an_unknown_code_is_internal_and_keeps_the_code() -> None:
    error = error_from_frame(frames.Error(code="brandNew", message="m", details={}))
    assert type(error) is Internal and error.details == {"code": "brandNew"}


def test_fatal_close_codes() -> None:
    assert set(FATAL_CLOSES) == {CloseCode.UNAUTHORIZED, CloseCode.POLICY, CloseCode.TOO_BIG}
    for code, cls in ((4401, Unauthorized), (1008, BadRequest), (1009, TooLarge)):
        error = close_error(code, "why")
        assert type(error) is cls and error.details == {"closeCode": code}
        assert "why" in str(error)
    for retryable in (None, 1000, 1001, 1006, 1011, CloseCode.TOO_SLOW):
        assert close_error(retryable, "") is None  # reconnecting may help


# ---------------------------------------------------------------------------------------------
# Replies by rid


def test_a_one_shot_reply_goes_to_its_handler_once() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    rid, data = protocol.request(frames.GetState(workspace="w"), "state?")
    assert rid == 1 and msgspec.json.decode(data)["rid"] == 1
    reply = raw(frames.StateFrame(rid=rid, workspace="w", seq=0, state={}))
    got = protocol.receive(reply)
    assert isinstance(got, Reply) and got.handler == "state?" and got.rid == rid
    assert isinstance(got.frame, frames.StateFrame)
    assert isinstance(protocol.receive(reply), Dropped)  # answered: not routed again
    assert protocol.pending() == []


def test_a_subscription_keeps_its_rid_until_an_error() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    rid, _ = protocol.request(frames.Subscribe(workspace="w", after_seq=0), "feed", once=False)
    subscribed = protocol.receive(raw(frames.Subscribed(rid=rid, workspace="w", head=0)))
    assert isinstance(subscribed, Reply) and subscribed.handler == "feed"
    error = raw(frames.Error(rid=rid, code="unavailable", message="catch-up failed", details={}))
    refused = protocol.receive(error)
    assert isinstance(refused, Refused) and refused.handler == "feed"
    assert refused.error.code == "unavailable"
    assert isinstance(protocol.receive(error), Notice)  # forgotten: now nobody's error
    assert protocol.pending() == []


def test_errors_without_a_pending_rid_are_notices() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    expired = protocol.receive(raw(frames.Error(code="unauthorized", message="exp", details={})))
    assert isinstance(expired, Notice) and expired.fatal
    assert isinstance(expired.error, Unauthorized)
    other = protocol.receive(raw(frames.Error(rid=99, code="conflict", message="m", details={})))
    assert isinstance(other, Notice) and not other.fatal and isinstance(other.error, Conflict)


def test_a_frame_of_an_unknown_shape_fails_its_request() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    rid, _ = protocol.request(frames.GetState(workspace="w"), "state?")
    got = protocol.receive(msgspec.json.encode({"op": "fromTheFuture", "rid": rid}))
    assert isinstance(got, Garbled) and got.handler == "state?" and isinstance(got.error, Internal)
    assert protocol.pending() == []
    assert isinstance(protocol.receive(b'{"op": "fromTheFuture", "rid": 5}'), Dropped)
    assert isinstance(protocol.receive(b"\xff not json"), Dropped)
    assert isinstance(protocol.receive(b'{"op": "ack", "rid": true}'), Dropped)


def test_forget_and_rids_increase() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    rids = [protocol.request(frames.GetState(workspace="w"), f"r{i}")[0] for i in range(3)]
    assert rids == [1, 2, 3]
    assert protocol.forget(2) == "r1" and protocol.forget(2) is None
    assert protocol.pending() == [(1, "r0"), (3, "r2")]
    assert protocol.handler(3) == "r2"


# ---------------------------------------------------------------------------------------------
# The resume cursor


def test_events_are_judged_by_the_workspace_cursor() -> None:
    protocol: ClientProtocol[str] = ClientProtocol()
    assert isinstance(protocol.receive(event_frame("w", 1)), Dropped)  # not followed
    cursor = protocol.track("w")
    first = protocol.receive(event_frame("w", 1))
    assert isinstance(first, EventIn) and first.verdict is Step.UNSTARTED
    cursor.restart(2)
    verdicts = [protocol.receive(event_frame("w", seq)) for seq in (1, 2, 3, 5, 4)]
    assert [v.verdict for v in verdicts if isinstance(v, EventIn)] == [
        Step.DUPLICATE,
        Step.DUPLICATE,
        Step.NEXT,
        Step.GAP,
        Step.NEXT,
    ]
    assert cursor.position == 4
    nxt = verdicts[2]
    assert isinstance(nxt, EventIn) and isinstance(nxt.event, MessagePosted) and nxt.seq == 3
    unknown = protocol.receive(event_frame("w", 5, kind="fromTheFuture"))
    assert isinstance(unknown, EventIn) and unknown.verdict is Step.NEXT
    assert unknown.event is None and cursor.position == 5  # skipped, but its seq counts
    no_seq = protocol.receive(raw(frames.EventFrame(workspace="w", event={"kind": "x"})))
    assert isinstance(no_seq, Dropped)
    protocol.untrack("w", ResumeCursor())  # another cursor: left alone
    assert protocol.cursor("w") is cursor
    protocol.untrack("w", cursor)
    assert protocol.cursor("w") is None


def test_a_non_contiguous_cursor_takes_any_later_seq() -> None:
    cursor = ResumeCursor(started=True, contiguous=False)
    assert [cursor.observe(s) for s in (3, 3, 10, 4, 11)] == [
        Step.NEXT,
        Step.DUPLICATE,
        Step.NEXT,
        Step.DUPLICATE,
        Step.NEXT,
    ]


# ---------------------------------------------------------------------------------------------
# Properties

_OPS = [
    "welcome", "subscribed", "unsubscribed", "event", "ack", "state", "error", "execAccepted",
    "execResult", "killed", "disposed", "execEvent", "execEnd", "future",
]  # fmt: skip

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)

_frame_like = st.fixed_dictionaries(
    {"op": st.sampled_from(_OPS)},
    optional={
        "rid": st.integers(-2, 6) | st.booleans() | st.text(max_size=3),
        "workspace": st.sampled_from(["w", "v"]) | st.text(max_size=3),
        "event": _json | st.fixed_dictionaries({"kind": st.text(max_size=12), "seq": _json}),
        "head": _json,
        "code": st.sampled_from([row.code for row in ERROR_TABLE]) | st.text(max_size=5),
        "message": _json,
        "details": _json,
        "seq": _json,
    },
).map(msgspec.json.encode)


def _armed() -> ClientProtocol[str]:
    protocol: ClientProtocol[str] = ClientProtocol()
    protocol.request(frames.GetState(workspace="w"), "once")
    protocol.request(frames.Subscribe(workspace="w", after_seq=0), "feed", once=False)
    protocol.track("w").restart(0)
    return protocol


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64) | _frame_like | _json.map(msgspec.json.encode), max_size=8))
def test_any_bytes_from_the_hub_give_only_typed_outcomes(frames_in: list[bytes]) -> None:
    protocol = _armed()
    for data in frames_in:
        try:
            got = protocol.receive(data)
        except AgoraError:  # allowed by the contract, though receive() never needs it
            continue
        assert isinstance(got, Reply | Refused | Garbled | EventIn | Notice | Dropped)
        if isinstance(got, Refused | Notice):
            assert isinstance(got.error, AgoraError)
        if isinstance(got, Garbled):
            assert isinstance(got.error, Internal)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.lists(st.integers(-3, 60), max_size=80))
def test_a_cursor_never_repeats_nor_skips_silently(start: int, seqs: list[int]) -> None:
    cursor = ResumeCursor()
    cursor.restart(start)
    delivered: list[int] = []
    for seq in seqs:
        before = cursor.position
        verdict = cursor.observe(seq)
        if verdict is Step.NEXT:
            assert seq == before + 1
            delivered.append(seq)
        elif verdict is Step.DUPLICATE:
            assert seq <= before
        else:
            assert verdict is Step.GAP and seq > before + 1  # reported, never swallowed
        assert cursor.position == (seq if verdict is Step.NEXT else before)
    assert delivered == list(range(start + 1, start + 1 + len(delivered)))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.data())
def test_resubscribing_on_gaps_delivers_the_log_exactly_once(
    head: int, data: st.DataObject
) -> None:
    """A hub that loses, repeats and replays events at random: a client resubscribing from its
    cursor on every gap still sees seqs 1..head once each, in order."""
    protocol: ClientProtocol[str] = ClientProtocol()
    cursor = protocol.track("w")
    cursor.restart(0)
    delivered: list[int] = []
    after = 0  # the hub sends from here on (the last subscribe's afterSeq)
    faults = data.draw(st.integers(0, 3 * head))  # then the hub behaves, so the test ends
    for _ in range(2 * faults + 2 * head + 2):
        if cursor.position >= head:
            break
        seq = after + 1
        # The hub's misbehaviour for this frame: none, a drop (a gap follows), a repeat of an
        # older event (a replay after a resubscribe).
        fault = data.draw(st.sampled_from(["ok", "drop", "repeat"])) if faults else "ok"
        faults -= fault != "ok"
        if fault == "drop" and seq < head:
            after += 1
            continue
        if fault == "repeat" and seq > 1:
            seq = data.draw(st.integers(1, seq - 1))
        else:
            after = seq
        got = protocol.receive(event_frame("w", seq))
        assert isinstance(got, EventIn)
        if got.verdict is Step.NEXT:
            delivered.append(got.seq)
        elif got.verdict is Step.GAP:
            after = cursor.position  # resubscribe from the cursor: the hub replays from there
    assert delivered == list(range(1, cursor.position + 1))
    assert cursor.position == head
