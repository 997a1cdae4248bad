"""A2A requests keep their W3C ``traceparent`` in the events they write (issue 17 item 6): the
request's header, as sent, in ``needWork``/``messagePosted`` and the file artifacts; a retry of
the same message with another trace is still the same event; an invalid header is ignored
(nothing refused, nothing kept)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from a2a_adapter.app import JSONRPC_PATH, A2AService
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def send(message_id: str, **message: Any) -> dict[str, Any]:
    msg = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "hi"}], **message}
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": msg, "configuration": {"returnImmediately": True}},
    }


async def test_the_request_trace_is_kept_in_its_events(
    service: A2AService, workspaces: Workspaces, token: TokenFactory
) -> None:
    headers = {"Authorization": f"Bearer {token()}", "A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=10) as http:
        mid = str(uuid.uuid4())
        first = await http.post(JSONRPC_PATH, json=send(mid), headers={"traceparent": TRACE})
        task = first.json()["result"]["task"]
        # A retry under another trace: the same task, nothing new written.
        again = await http.post(JSONRPC_PATH, json=send(mid), headers={"traceparent": OTHER})
        assert again.json()["result"]["task"]["id"] == task["id"]
        follow = await http.post(
            JSONRPC_PATH,
            json=send(str(uuid.uuid4()), taskId=task["id"]),
            headers={"traceparent": OTHER},
        )
        assert "result" in follow.json(), follow.json()
        bad = await http.post(
            JSONRPC_PATH, json=send(str(uuid.uuid4())), headers={"traceparent": "00-nonsense"}
        )
        assert "result" in bad.json(), bad.json()

    events = [e async for e in workspaces.store.read(WORKSPACE)]
    needs = [e for e in events if e.kind == "needWork"]
    assert [e.traceparent for e in needs] == [TRACE, None]
    (posted,) = [e for e in events if e.kind == "messagePosted"]
    assert posted.traceparent == OTHER
    assert all(e.traceparent is None for e in events if e.kind.startswith("member"))
