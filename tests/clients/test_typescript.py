"""The TypeScript client (clients/typescript, ``@agora-hub/client``) in the suite: its node
tests (``npm test``: the generated types checked against schemas/, the build, and
``node --test`` against real ``agora serve`` hubs the node tests start and restart), its error
codes against the hub's one table, and its example agent working a Python agent's item.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.client import connect
from hub.core.errors import ERROR_TABLE
from hub.core.events import WorkPublished
from tests.support.hub import HubProcess, HubStarter
from tests.support.node import CLIENT_DIR, built_node, node_env, require_node, run_agent

NODE_TESTS_TIMEOUT = 900.0


@pytest.fixture(scope="module")
def node() -> str:
    return built_node()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path)
    yield starter.start()
    starter.close()


def test_error_codes_are_the_hub_table() -> None:
    text = (CLIENT_DIR / "src" / "errors.ts").read_text()
    block = text.split("const BY_CODE", 1)[1].split("]);", 1)[0]
    codes = re.findall(r'\["(\w+)", \w+\]', block)
    assert codes == [row.code for row in ERROR_TABLE]


def test_generated_types_match_schemas(node: str) -> None:
    proc = subprocess.run(
        [node, "scripts/generate.mjs", "--check"],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", ["typecheck-examples", "format-check"])
def test_typescript_checks(node: str, script: str) -> None:
    """examples/quickstart.ts (the README's example) type-checks against the built
    declarations; the sources are formatted (prettier, like ruff format for the Python)."""
    _, npm = require_node()
    proc = subprocess.run(
        [npm, "run", "--silent", script],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_node_suite(node: str) -> None:
    """``node --test`` over clients/typescript/test/*.test.mjs (each starts its own hubs)."""
    tests = sorted(str(p.relative_to(CLIENT_DIR)) for p in (CLIENT_DIR / "test").glob("*.test.mjs"))
    assert tests
    proc = subprocess.run(
        [node, "--test", "--test-concurrency=1", *tests],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=NODE_TESTS_TIMEOUT,
        env=node_env(),
    )
    summary = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("# "))
    failures = re.findall(r"^not ok .*$", proc.stdout, re.M)
    tail = f"{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{failures}\n{summary}\n{tail}"
    assert "# fail 0" in summary and "# pass 0" not in summary, summary


async def test_agent_script_serves_a_python_agents_item(node: str, hub: HubProcess) -> None:
    """A Python agent asks; the TS example agent (a subprocess) claims, writes a file with
    baseRev, asks for feedback, publishes and completes; the Python agent sees it all."""
    async with connect(hub.url, hub.token("py")) as session:
        ws = session.workspace("joint")
        item = await ws.request_work("build", {"spec": "greet"})
        cid = item.correlation_id
        assert cid is not None
        agent = asyncio.create_task(
            asyncio.to_thread(
                run_agent,
                node,
                hub.url,
                hub.token("ts"),
                "joint",
                "serve-work",
                {
                    "topic": "build",
                    "timeout": 30,
                    "file": {"path": "src/hello.txt", "text": "hello from ts"},
                    "feedback": True,
                    "result": {"ok": True, "by": "ts"},
                },
            )
        )
        asked = await ws.wait_for_kind(cid, "feedbackRequested", timeout=60)
        assert asked.producer == "ts"
        await ws.provide_feedback(cid, {"answer": "yes"})
        code, out = await agent
        assert code == 0, out
        assert out["correlationId"] == cid and out["feedback"] == {"answer": "yes"}
        published = await ws.wait_for_kind(cid, "workPublished", timeout=30)
        assert isinstance(published, WorkPublished)
        assert published.producer == "ts" and published.payload == {"ok": True, "by": "ts"}
        assert await ws.read_file("src/hello.txt") == "hello from ts"
        state = await ws.state()
        assert state.work_items[cid].status == "completed"
        assert state.work_items[cid].owner == "ts"


def test_agent_script_reports_typed_errors(node: str, hub: HubProcess) -> None:
    code, out = run_agent(
        node, hub.url, hub.token("ts"), "w", "write-file", {"path": "../x", "text": "t"}
    )
    assert code == 1 and out["error"] == "badRequest", out
    code, out = run_agent(node, hub.url, "bogus", "w", "post", {"text": "x"})
    assert code == 1 and out["error"] == "unauthorized", out


def test_agent_script_single_verbs(node: str, hub: HubProcess) -> None:
    token = hub.token("ts")
    code, item = run_agent(node, hub.url, token, "v", "request-work", {"topic": "t"})
    assert code == 0, item
    cid = item["correlationId"]
    code, found = run_agent(node, hub.url, token, "v", "wait-work", {"topic": "t"})
    assert code == 0 and found["correlationId"] == cid, found
    for action in ("claim", "publish-work", "complete"):
        code, ev = run_agent(node, hub.url, token, "v", action, {"correlationId": cid})
        assert code == 0 and ev["correlationId"] == cid and ev["producer"] == "ts", ev
    code, ev = run_agent(node, hub.url, token, "v", "cancel", {"correlationId": cid})
    assert code == 1 and ev["error"] == "conflict", ev  # completed is terminal
