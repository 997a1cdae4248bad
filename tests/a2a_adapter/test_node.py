"""Interop with @a2a-js/sdk (1.x) under Node: a small script sends, streams and asks for an
unknown task. Skipped, with the reason, when node or npm is missing or the package cannot be
installed (it is installed once into tests/.node, which git ignores) — and failed instead when
``AGORA_REQUIRE`` names ``node`` (CI does)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

from a2a_adapter.app import A2AService
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, Worker
from tests.support.require import require

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / ".node" / "a2a-js"
SCRIPT = Path(__file__).with_name("node") / "peer.mjs"
PACKAGE = "@a2a-js/sdk@1"


def _node_peer() -> Path:
    """The directory holding node_modules/@a2a-js/sdk and the script (installed once)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        require("node", False, "node/npm are not installed")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    if not version.stdout.startswith("v") or int(version.stdout[1:].split(".")[0]) < 20:
        require("node", False, f"@a2a-js/sdk needs node >= 20, found {version.stdout.strip()}")
    if not (NODE_DIR / "node_modules" / "@a2a-js" / "sdk" / "package.json").exists():
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        (NODE_DIR / "package.json").write_text('{"private": true, "type": "module"}\n')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", PACKAGE],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            require("node", False, f"npm install {PACKAGE} failed: {done.stderr.strip()[-300:]}")
    shutil.copy(SCRIPT, NODE_DIR / SCRIPT.name)
    return NODE_DIR


async def test_a2a_js_peer(
    service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    where = await asyncio.to_thread(_node_peer)
    async with Worker(workspaces):
        proc = await asyncio.create_subprocess_exec(
            "node",
            SCRIPT.name,
            service.url,
            token("node-peer"),
            WORKSPACE,
            cwd=where,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    result = json.loads(out.decode().strip().splitlines()[-1])
    completed = 3  # TaskState.TASK_STATE_COMPLETED in the proto enum
    assert result["protocolVersion"] == "1.0"
    assert result["blocking"] == {
        "state": completed,
        "contextId": WORKSPACE,
        "artifacts": ["result: from node"],
    }
    assert result["stream"] == [
        "task:1",
        "statusUpdate:2",
        "artifactUpdate",
        f"statusUpdate:{completed}",
    ]
    assert result["getTask"]["state"] == completed
    assert result["unknown"]["name"].endswith("TaskNotFoundError"), result["unknown"]
    assert result["unknown"]["isTaskNotFound"] or result["unknown"]["code"] == -32001
    log = await workspaces.store.read_batch(WORKSPACE, limit=1000)
    assert {e.producer for e in log if e.kind == "needWork"} == {"node-peer"}
