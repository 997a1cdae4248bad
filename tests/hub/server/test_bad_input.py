"""Every class of bad input gets its error (or close code) and leaves the log unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.support.hub import HubProcess
from tests.support.peer import message, peer
from tests.support.tokens import mint

WS = "bad"

# (name, raw frame text, expected code, expected details.field or None)
BAD_FRAMES: list[tuple[str, str | bytes, str, str | None]] = [
    ("malformed JSON", '{"op": "publish", "workspace": ', "badRequest", "$"),
    ("not an object", "[1, 2]", "badRequest", "$"),
    ("unknown op", '{"op": "bogus", "rid": 1}', "badRequest", "$.op"),
    ("missing op", '{"workspace": "bad"}', "badRequest", "$.op"),
    (
        "wrong type",
        json.dumps({"op": "subscribe", "workspace": WS, "afterSeq": "zero"}),
        "badRequest",
        "$.afterSeq",
    ),
    (
        "negative seq",
        json.dumps({"op": "state", "workspace": WS, "atSeq": -1}),
        "badRequest",
        "$.atSeq",
    ),
    (
        "wrong type in a payload",
        json.dumps(
            {
                "op": "publish",
                "workspace": WS,
                "event": {"kind": "fileWritten", "payload": {"path": 5}},
            }
        ),
        "badRequest",
        "$.event.payload.path",
    ),
    (
        "unknown kind",
        json.dumps({"op": "publish", "workspace": WS, "events": [{"kind": "nope"}]}),
        "badRequest",
        "$.events[0].kind",
    ),
    (
        "unknown field",
        json.dumps({"op": "publish", "workspace": WS, "event": message(), "bogus": 1}),
        "badRequest",
        "$.bogus",
    ),
    (
        "bad path",
        json.dumps(
            {
                "op": "publish",
                "workspace": WS,
                "event": {"kind": "fileWritten", "payload": {"path": "../x", "text": "x"}},
            }
        ),
        "badRequest",
        "$.event.payload.path",
    ),
    (
        "bad path in a batch",
        json.dumps(
            {
                "op": "publish",
                "workspace": WS,
                "events": [
                    message(),
                    {"kind": "fileDeleted", "payload": {"path": "/etc/passwd"}},
                ],
            }
        ),
        "badRequest",
        "$.events[1].payload.path",
    ),
    (
        "bad workspace name",
        json.dumps({"op": "publish", "workspace": "no/slash", "event": message()}),
        "badRequest",
        "$.workspace",
    ),
    (
        "neither event nor events",
        json.dumps({"op": "publish", "workspace": WS}),
        "badRequest",
        "$.event",
    ),
    (
        "empty batch",
        json.dumps({"op": "publish", "workspace": WS, "events": []}),
        "badRequest",
        "$.events",
    ),
    (
        "hub kind",
        json.dumps(
            {
                "op": "publish",
                "workspace": WS,
                "event": {"kind": "memberJoined", "payload": {"agent": "alice"}},
            }
        ),
        "forbidden",
        None,
    ),
    (
        "too many events in a batch",
        json.dumps({"op": "publish", "workspace": WS, "events": [message()] * 257}),
        "tooLarge",
        "$.events",
    ),
    ("binary frame", b'{"op": "state", "workspace": "bad"}', "badRequest", "$"),
]


@pytest.mark.parametrize(
    ("raw", "code", "field"),
    [pytest.param(raw, code, field, id=name) for name, raw, code, field in BAD_FRAMES],
)
async def test_bad_frame_gets_its_error_and_changes_nothing(
    hub: HubProcess, raw: str | bytes, code: str, field: str | None
) -> None:
    async with peer(hub.url, mint()) as p:
        await p.publish(WS, message("seed"))
        before = await p.head(WS)
        await p.send(raw)
        error = await p.recv()
        assert error["op"] == "error" and error["code"] == code, error
        assert set(error) >= {"code", "message", "details"}
        if field is not None:
            assert error["details"]["field"] == field, error
        # The connection is kept and the log is unchanged.
        assert await p.head(WS) == before


async def test_error_repeats_the_rid_of_a_frame_that_failed_to_decode(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        await p.send({"op": "subscribe", "rid": "r-7", "workspace": WS, "afterSeq": "x"})
        error = await p.recv()
    assert error["rid"] == "r-7" and error["code"] == "badRequest"


async def test_oversize_frame_closes_1009(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        before = await p.head(WS)
        big = message("x" * (1024 * 1024 + 1))
        await p.send({"op": "publish", "workspace": WS, "event": big})
        closed = await p.closed()
    assert closed.rcvd is not None and closed.rcvd.code == 1009
    async with peer(hub.url, mint()) as p:
        assert await p.head(WS) == before


async def test_garbage_flood_closes_1008(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        before = await p.head(WS)
        for i in range(20):
            await p.send(f"garbage {i}")
        errors = []
        closed = None
        try:
            while True:
                errors.append(await p.recv())
        except Exception:
            closed = await p.closed()
    assert closed is not None and closed.rcvd is not None and closed.rcvd.code == 1008
    assert len(errors) == 20 and all(e["code"] == "badRequest" for e in errors)
    async with peer(hub.url, mint()) as p:
        assert await p.head(WS) == before


async def test_a_few_bad_frames_do_not_close(hub: HubProcess) -> None:
    async with peer(hub.url, mint()) as p:
        for _ in range(19):
            await p.send("garbage")
            assert (await p.recv())["code"] == "badRequest"
        assert (await p.publish(WS, message()))["op"] == "ack"


async def test_rate_limit(start_hub: Callable[..., HubProcess]) -> None:
    hub = start_hub("[limits]\npublish_rate = 2.0\npublish_burst = 5\n")
    async with peer(hub.url, mint()) as p:
        ack = await p.call("publish", workspace="rl", events=[message()] * 5)
        assert ack["op"] == "ack"
        limited = await p.publish("rl", message())
        assert limited["code"] == "rateLimited", limited
        assert 0 < limited["details"]["retryAfterMs"] <= 1000
        assert await p.head("rl") == 5
        # A batch larger than the burst can never pass: tooLarge, not a retry hint.
        too_big = await p.call("publish", workspace="rl", events=[message()] * 6)
        assert too_big["code"] == "tooLarge"
