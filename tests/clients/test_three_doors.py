"""Issue 18's must-show: an MCP client, a TypeScript agent and a Python agent work one item
together over a real ``agora serve`` (request → claim → file → feedback → complete), and
``agora replay`` shows each one's events under its own agent.

- the MCP client (``agora mcp`` over stdio, the official SDK's ``ClientSession``) opens the item
  and reads the file the TypeScript agent wrote;
- the TypeScript agent (``clients/typescript/examples/agent.mjs``, a node subprocess) claims it,
  writes the file with ``baseRev``, asks for feedback, publishes and completes;
- the Python agent (``hub.client``) gives the feedback.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.client import connect
from tests.support.hub import HubProcess, HubStarter
from tests.support.mcp import MCP_HUB_CONFIG, mcp_stdio, structured
from tests.support.node import built_node, run_agent
from tests.support.paths import REPO

WORKSPACE = "joint"


@pytest.fixture(scope="module")
def node() -> str:
    return built_node()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path)
    yield starter.start(MCP_HUB_CONFIG)
    starter.close()


def replay(hub: HubProcess) -> list[tuple[str, str]]:
    """(producer, kind) of every event, from ``agora replay`` in a process of its own."""
    proc = subprocess.run(
        [sys.executable, "-m", "hub", "replay", WORKSPACE, "--json", "--data", str(hub.data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    return [(e["producer"], e["kind"]) for e in events]


async def test_mcp_typescript_and_python_agents_work_one_item(node: str, hub: HubProcess) -> None:
    async with (
        mcp_stdio(hub, hub.token("mcp-agent"), workspace=WORKSPACE) as mcp,
        connect(hub.url, hub.token("py-agent")) as py,
    ):
        opened = structured(
            await mcp.call_tool("request_work", {"topic": "greet", "payload": {"lang": "en"}})
        )
        cid = opened["correlationId"]
        ts = asyncio.create_task(
            asyncio.to_thread(
                run_agent,
                node,
                hub.url,
                hub.token("ts-agent"),
                WORKSPACE,
                "serve-work",
                {
                    "topic": "greet",
                    "timeout": 30,
                    "file": {"path": "out/hello.txt", "text": "hello from ts"},
                    "feedback": True,
                    "result": {"ok": True},
                },
            )
        )
        ws = py.workspace(WORKSPACE)
        asked = await ws.wait_for_kind(cid, "feedbackRequested", timeout=60)
        assert asked.producer == "ts-agent"
        await ws.provide_feedback(cid, {"answer": "ship it"})
        code, out = await ts
        assert code == 0, out
        assert out["correlationId"] == cid and out["feedback"] == {"answer": "ship it"}
        read = structured(await mcp.call_tool("read_file", {"path": "out/hello.txt"}))
        assert read["text"] == "hello from ts"
        state = await ws.state()
        assert state.work_items[cid].status == "completed"
        assert state.work_items[cid].owner == "ts-agent"

    steps = [step for step in replay(hub) if not step[1].startswith("member")]
    assert steps == [
        ("mcp-agent", "needWork"),
        ("ts-agent", "workClaimed"),
        ("ts-agent", "fileWritten"),
        ("ts-agent", "feedbackRequested"),
        ("py-agent", "feedbackProvided"),
        ("ts-agent", "workPublished"),
        ("ts-agent", "completed"),
    ]


# -- one scenario table, three doors ----------------------------------------------------------

SCENARIO: list[tuple[str, dict[str, object]]] = [
    ("post", {"text": "hello"}),
    ("write-file", {"path": "notes/a.txt", "text": "v1", "baseRev": 0}),
    ("request-work", {"topic": "review", "payload": {"n": 1}}),
    ("claim", {"payload": {"eta": "soon"}}),
    ("publish-work", {"payload": {"result": 2}}),
    ("complete", {}),
]
"""Steps as the TypeScript agent's actions; work steps apply to the item the table opened."""

MCP_TOOL = {
    "post": "post_message",
    "write-file": "write_file",
    "request-work": "request_work",
    "claim": "claim_work",
    "publish-work": "publish_work",
    "complete": "complete_work",
}


async def run_python(hub: HubProcess, workspace: str) -> None:
    async with connect(hub.url, hub.token("door")) as session:
        ws = session.workspace(workspace)
        cid = ""
        for action, args in SCENARIO:
            payload = args.get("payload")
            match action:
                case "post":
                    await ws.post_message(str(args["text"]))
                case "write-file":
                    await ws.write_file(str(args["path"]), str(args["text"]), base_rev=0)
                case "request-work":
                    cid = (await ws.request_work(str(args["topic"]), payload)).correlation_id or ""
                case "claim":
                    await ws.claim_work(cid, payload)
                case "publish-work":
                    await ws.publish_work(cid, payload)
                case "complete":
                    await ws.signal_completed(cid, payload)


async def run_typescript(node: str, hub: HubProcess, workspace: str) -> None:
    cid = ""
    for action, args in SCENARIO:
        sent = dict(args, correlationId=cid) if cid else dict(args)
        code, out = await asyncio.to_thread(
            run_agent, node, hub.url, hub.token("door"), workspace, action, sent
        )
        assert code == 0, (action, out)
        if action == "request-work":
            cid = out["correlationId"]


async def run_mcp(hub: HubProcess, workspace: str) -> None:
    async with mcp_stdio(hub, hub.token("door"), workspace=workspace) as mcp:
        cid = ""
        for action, args in SCENARIO:
            sent = dict(args, correlationId=cid) if cid else dict(args)
            out = structured(await mcp.call_tool(MCP_TOOL[action], sent))
            if action == "request-work":
                cid = out["correlationId"]


def shape(hub: HubProcess, workspace: str) -> list[tuple[str, str, object]]:
    """(producer, kind, payload) of the scenario's events (presence left out)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hub", "replay", workspace, "--json", "--data", str(hub.data_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    return [
        (e["producer"], e["kind"], e.get("payload"))
        for e in events
        if not e["kind"].startswith("member")
    ]


async def test_one_scenario_table_gives_the_same_events_through_every_door(
    node: str, hub: HubProcess
) -> None:
    await run_python(hub, "by-python")
    await run_typescript(node, hub, "by-typescript")
    await run_mcp(hub, "by-mcp")
    python = shape(hub, "by-python")
    assert [kind for _, kind, _ in python] == [
        "messagePosted",
        "fileWritten",
        "needWork",
        "workClaimed",
        "workPublished",
        "completed",
    ]
    assert shape(hub, "by-typescript") == python
    assert shape(hub, "by-mcp") == python
