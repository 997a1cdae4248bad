"""The MCP tools against a real ``agora serve``, through the official SDK's ``ClientSession``
over stdio (``agora mcp``): what each tool writes is what a WebSocket client writes (read back
with the Python client), and every bad call is a tool error with Agora's stable code and
nothing written."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from backends.code_tool import CODE_EXEC_PARAMETERS
from hub.client import connect
from hub.config import LimitsConfig
from hub.core.events import Event
from hub.core.validation import DEFAULT_LIMITS
from hub.mcp.tools import MAX_SCAN_EVENTS, MAX_WAIT_MS, TOOLS
from tests.support.hub import HubProcess
from tests.support.mcp import mcp_stdio, structured, tool_error
from tests.support.tokens import mint


async def _events(hub: HubProcess, workspace: str) -> list[Event]:
    async with connect(hub.url, hub.token("observer", rights=("read",))) as session:
        return await session.workspace(workspace).events()


async def _call(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    return structured(await session.call_tool(name, arguments))


async def _error(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    return tool_error(await session.call_tool(name, arguments))


async def test_tools_are_listed_with_typed_schemas(hub: HubProcess, workspace: str) -> None:
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert list(listed) == list(TOOLS)
    write = listed["write_file"].input_schema
    assert write["required"] == ["path"]
    assert write["additionalProperties"] is False
    assert {"path", "text", "base64", "baseRev", "workspace"} <= set(write["properties"])
    code = listed["code_exec"].input_schema
    # The existing tool schema's languages (backends.code_tool), javascript/typescript included.
    assert code["properties"]["language"]["enum"] == list(
        CODE_EXEC_PARAMETERS["properties"]["language"]["enum"]
    )
    assert {"javascript", "typescript"} <= set(code["properties"]["language"]["enum"])
    assert listed["read_file"].annotations is not None
    assert listed["read_file"].annotations.read_only_hint is True


async def test_files_with_base_rev(hub: HubProcess, workspace: str) -> None:
    async with mcp_stdio(hub, hub.token("alice"), workspace=workspace) as session:
        wrote = await _call(session, "write_file", path="src/a.py", text="x = 1\n", baseRev=0)
        assert (wrote["kind"], wrote["rev"], wrote["seq"]) == ("fileWritten", 1, 1)
        stale = await _error(session, "write_file", path="src/a.py", text="x = 2\n", baseRev=0)
        assert stale["code"] == "conflict"
        assert stale["details"]["rev"] == 1
        await _call(session, "write_file", path="src/a.py", text="x = 2\n", baseRev=1)
        blob = await _call(session, "write_file", path="b.bin", base64="AAEC")
        read = await _call(session, "read_file", path="src/a.py")
        assert (read["text"], read["rev"], read["producer"]) == ("x = 2\n", 2, "alice")
        assert (await _call(session, "read_file", path="b.bin"))["base64"] == "AAEC"
        listed = await _call(session, "list_files", prefix="src/")
        assert [f["path"] for f in listed["files"]] == ["src/a.py"]
        moved = await _call(session, "move_file", **{"from": "src/a.py", "to": "a.py"})
        assert moved["rev"] == 3
        assert (await _error(session, "read_file", path="src/a.py"))["code"] == "notFound"
        await _call(session, "delete_file", path="b.bin", baseRev=blob["rev"])
        assert (await _error(session, "delete_file", path="b.bin"))["code"] == "notFound"
    events = await _events(hub, workspace)
    kinds = [(e.kind, e.producer) for e in events if not e.kind.startswith("member")]
    assert kinds == [
        ("fileWritten", "alice"),
        ("fileWritten", "alice"),
        ("fileWritten", "alice"),
        ("fileMoved", "alice"),
        ("fileDeleted", "alice"),
    ]


async def test_work_item_verbs(hub: HubProcess, workspace: str) -> None:
    async with (
        mcp_stdio(hub, hub.token("alice"), workspace=workspace) as alice,
        mcp_stdio(hub, hub.token("bob"), workspace=workspace) as bob,
    ):
        opened = await _call(alice, "request_work", topic="review", payload={"file": "a.py"})
        cid = opened["correlationId"]
        open_work = await _call(bob, "list_open_work", topic="review")
        assert [i["correlationId"] for i in open_work["items"]] == [cid]
        assert open_work["items"][0]["status"] == "requested"
        await _call(bob, "claim_work", correlationId=cid)
        taken = await _error(alice, "claim_work", correlationId=cid)
        assert taken["code"] == "conflict"
        await _call(bob, "publish_work", correlationId=cid, payload={"diff": "…"})
        await _call(bob, "request_feedback", correlationId=cid, consumer="alice")
        await _call(alice, "provide_feedback", correlationId=cid, payload="looks good")
        await _call(bob, "block_work", correlationId=cid, payload="waiting for CI")
        await _call(bob, "complete_work", correlationId=cid, topic="review")
        assert (await _call(alice, "list_open_work"))["items"] == []
        other = (await _call(alice, "request_work", topic="docs"))["correlationId"]
        await _call(alice, "cancel_work", correlationId=other)
        finished = await _error(alice, "complete_work", correlationId=other)
        assert finished["code"] == "conflict"
        await _call(alice, "post_message", text="done", data={"items": 2})
    events = [e for e in await _events(hub, workspace) if not e.kind.startswith("member")]
    assert [(e.kind, e.producer) for e in events] == [
        ("needWork", "alice"),
        ("workClaimed", "bob"),
        ("workPublished", "bob"),
        ("feedbackRequested", "bob"),
        ("feedbackProvided", "alice"),
        ("blocked", "bob"),
        ("completed", "bob"),
        ("needWork", "alice"),
        ("workCancelled", "alice"),
        ("messagePosted", "alice"),
    ]
    assert (events[0].topic, events[1].topic, events[6].topic) == ("review", None, "review")


async def test_wait_state_and_timeline(hub: HubProcess, workspace: str) -> None:
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        waited = await _call(session, "wait_for_event", kinds=["messagePosted"], timeoutMs=200)
        assert waited["timedOut"] is True
        for n in range(5):
            await _call(session, "post_message", text=f"m{n}")
        found = await _call(session, "wait_for_event", afterSeq=0, kinds=["messagePosted"])
        assert found["event"]["payload"]["text"] == "m0"
        # seq 1 is the session's memberJoined (its subscription), then m0 … m4
        state = await _call(session, "workspace_state", atSeq=3)
        assert (state["workspace"], state["seq"], state["messages"]) == (workspace, 3, 2)
        page = await _call(session, "timeline", afterSeq=1, limit=2)
        assert [e["seq"] for e in page["events"]] == [2, 3]
        assert page["more"] is True
        rest = await _call(session, "timeline", afterSeq=page["nextAfterSeq"], limit=100)
        assert [e["payload"]["text"] for e in rest["events"]] == ["m2", "m3", "m4"]
        assert rest["more"] is False


async def test_wait_scans_a_bounded_history(hub: HubProcess, workspace: str) -> None:
    """The attack: ``afterSeq: 0`` on a long log with a filter nothing matches. The call reads
    at most ``MAX_SCAN_EVENTS`` events, then answers at once with the cursor reached."""
    assert str(MAX_SCAN_EVENTS) in TOOLS["wait_for_event"].description
    batch = LimitsConfig().max_batch_events
    rounds = MAX_SCAN_EVENTS // batch + 2

    async def fill(writer: int) -> None:
        async with connect(hub.url, hub.token(f"filler{writer}")) as session:
            ws = session.workspace(workspace)
            for r in range(writer, rounds, 4):
                await ws.publish_batch(
                    [{"kind": "messagePosted", "payload": {"text": f"{r}"}}] * batch
                )

    async with asyncio.TaskGroup() as tg:
        for writer in range(4):
            tg.create_task(fill(writer))
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        started = time.monotonic()
        waited = await _call(
            session, "wait_for_event", afterSeq=0, kinds=["completed"], timeoutMs=MAX_WAIT_MS
        )
        assert time.monotonic() - started < MAX_WAIT_MS / 1000 / 2
        assert waited == {
            "workspace": workspace,
            "timedOut": False,
            "more": True,
            "nextAfterSeq": MAX_SCAN_EVENTS,
        }
        again = await _call(
            session, "wait_for_event", afterSeq=waited["nextAfterSeq"], kinds=["messagePosted"]
        )
        assert again["event"]["seq"] == MAX_SCAN_EVENTS + 1


async def test_wait_is_bounded(hub: HubProcess, workspace: str) -> None:
    """A timeoutMs beyond the cap waits the cap, not longer; the schema says the cap."""
    assert str(MAX_WAIT_MS) in TOOLS["wait_for_event"].description
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        bad = await _error(session, "wait_for_event", timeoutMs=-1)
        assert bad["code"] == "badRequest"


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("write_file", {"path": "a.txt", "text": "x", "color": "red"}, "color"),
        ("write_file", {"path": 7, "text": "x"}, "path"),
        ("write_file", {"path": "../etc/passwd", "text": "x"}, "path"),
        ("write_file", {"path": "a.txt"}, "text"),
        ("write_file", {"path": "a.txt", "base64": "not base64!"}, "base64"),
        ("write_file", {"path": "a.txt", "text": "x", "baseRev": -1}, "baseRev"),
        ("post_message", {}, None),  # data nested past max_depth: built below
        ("timeline", {"limit": 0}, "limit"),
        ("code_exec", {"language": "cobol", "code": "x"}, "arguments"),
    ],
)
async def test_bad_arguments_write_nothing(
    hub: HubProcess, workspace: str, name: str, arguments: dict[str, Any], field: str | None
) -> None:
    if field is None:  # nested past max_depth
        value: Any = "leaf"
        for _ in range(DEFAULT_LIMITS.max_depth + 2):
            value = [value]
        arguments = {"data": value}
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        error = await _error(session, name, **arguments)
    assert error["code"] == "badRequest", error
    if field is not None:
        assert field in str(error["details"].get("field")) or field in error["message"]
    assert await _events(hub, workspace) == []


async def test_too_large_writes_nothing(hub: HubProcess, workspace: str) -> None:
    text = "x" * (DEFAULT_LIMITS.max_event_bytes + 1)
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        error = await _error(session, "write_file", path="big.txt", text=text)
        assert error["code"] == "tooLarge"
        assert error["details"]["limit"] == DEFAULT_LIMITS.max_event_bytes
    assert await _events(hub, workspace) == []


async def test_rights_are_the_tokens(hub: HubProcess, workspace: str) -> None:
    reader = hub.token("reader", rights=("read",))
    elsewhere = mint("alice", ["somewhere-else"], ["read", "write"], secret=hub.secret)
    async with mcp_stdio(hub, reader, workspace=workspace) as session:
        assert (await _error(session, "post_message", text="hi"))["code"] == "forbidden"
        assert (await _call(session, "list_files"))["files"] == []
    async with mcp_stdio(hub, elsewhere, workspace=workspace) as session:
        denied = await _error(session, "write_file", path="a.txt", text="x")
        assert denied["code"] == "forbidden"
        assert (await _error(session, "list_files"))["code"] == "forbidden"
    assert await _events(hub, workspace) == []


async def test_no_default_workspace_is_a_bad_request(hub: HubProcess) -> None:
    async with mcp_stdio(hub, hub.token()) as session:
        error = await _error(session, "post_message", text="hi")
        assert (error["code"], error["details"]["field"]) == ("badRequest", "workspace")


async def test_unknown_tool_is_a_protocol_error(hub: HubProcess, workspace: str) -> None:
    async with mcp_stdio(hub, hub.token(), workspace=workspace) as session:
        with pytest.raises(MCPError) as caught:
            await session.call_tool("rm_rf", {})
    assert caught.value.data["agoraCode"] == "notFound"


async def test_code_exec_runs_on_the_tokens_backend(hub: HubProcess, workspace: str) -> None:
    token = hub.token("alice", rights=("read", "write", "exec"), backends=("python",))
    async with mcp_stdio(hub, token, workspace=workspace) as session:
        ran = await _call(session, "code_exec", language="python", code="input * 2", input=21)
        assert (ran["status"], ran["value"], ran["backend"]) == ("success", 42, "python")
        clamped = await _call(
            session, "code_exec", language="python", code="1", timeout_secs=300
        )  # above the instance's ceiling: run at the ceiling, as CodeTool does
        assert clamped["status"] == "success"
        refused = await _error(session, "code_exec", language="shell", code="echo hi")
        assert refused["code"] == "forbidden"  # the token names only the python backend
    events = await _events(hub, workspace)
    requested = [e for e in events if e.kind == "execRequested"]
    assert [(e.producer, e.payload.backend) for e in requested] == [("alice", "python")] * 2
    assert events[-1].kind == "execFinished"
