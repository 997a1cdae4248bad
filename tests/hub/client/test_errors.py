"""hub/client/errors.py and the errors a user meets through the client, against a real
``agora serve`` (fixtures in conftest.py)."""

from __future__ import annotations

import pytest

from hub.client import Session, connect, error_from_frame
from hub.core.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Internal,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from hub.core.wire.frames import Error
from tests.hub.client.helpers import message, name
from tests.support.hub import HubProcess


def test_error_codes_map_to_classes() -> None:
    error = error_from_frame(Error(code="conflict", message="m", details={"head": 3}))
    assert isinstance(error, Conflict) and error.details == {"head": 3}
    assert isinstance(
        error_from_frame(Error(code="rateLimited", message="m", details={})), RateLimited
    )
    unknown = error_from_frame(Error(code="brandNew", message="m", details={}))
    assert isinstance(unknown, Internal) and unknown.details["code"] == "brandNew"


async def test_bad_token_raises_unauthorized_at_connect(hub: HubProcess) -> None:
    with pytest.raises(Unauthorized):
        async with connect(hub.url, "not-a-token"):
            pass
    forged = HubProcess(hub.data_dir).signer  # same class, but sign with another secret:
    forged = type(forged)(b"x" * 40)
    with pytest.raises(Unauthorized):
        async with connect(hub.url, forged.issue("eve", ["*"], ["read"], ttl_seconds=60)):
            pass


async def test_unreachable_hub_raises_unavailable() -> None:
    with pytest.raises(Unavailable):
        async with connect("ws://127.0.0.1:9", "token", open_timeout=2):
            pass


async def test_forbidden_without_write_right(hub: HubProcess, alice: Session) -> None:
    w = name()
    await alice.workspace(w).post_message("hello")
    async with connect(hub.url, hub.token("reader", rights=("read",))) as reader:
        ws = reader.workspace(w)
        with pytest.raises(Forbidden) as info:
            await ws.post_message("may I?")
        assert info.value.details.get("right") == "write"
        # Reading is allowed, and the session survives the refusal.
        assert [e.seq for e in await ws.events()] == [1]


async def test_forbidden_workspace_subscription(hub: HubProcess) -> None:
    async with connect(hub.url, hub.token("carol", workspaces=("mine",))) as carol:
        with pytest.raises(Forbidden):
            await carol.workspace("theirs").events()
        with pytest.raises(Forbidden):
            await carol.workspace("theirs").state()
        assert (await carol.workspace("mine").state()).seq >= 0  # still usable


async def test_conflict_on_stale_expected_seq(alice: Session) -> None:
    ws = alice.workspace(name())
    first = await ws.publish(message("one"), expected_seq=0)
    assert first.seq == 1
    with pytest.raises(Conflict) as info:
        await ws.publish(message("two"), expected_seq=0)
    assert info.value.details["head"] == 1
    assert (await ws.publish(message("two"), expected_seq=1)).seq == 2


async def test_bad_request_names_the_field(alice: Session) -> None:
    ws = alice.workspace(name())
    with pytest.raises(BadRequest) as info:
        await ws.write_file("../escape", "x")
    assert "path" in str(info.value.details.get("field"))
    with pytest.raises(BadRequest):
        await ws.publish({"kind": "noSuchKind"})  # refused locally, nothing sent
