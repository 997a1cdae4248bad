"""``agora mcp`` as a user (or an MCP client's launcher) runs it: a subprocess whose stdout is
the MCP channel. Its tools are tested in tests/hub/mcp/ over this same command."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.commands.mcp import parse_backends
from hub.core.errors import BadRequest
from hub.mcp.tools import DEFAULT_BACKENDS
from tests.support.hub import HubProcess, HubStarter
from tests.support.mcp import mcp_stdio, structured
from tests.support.paths import REPO


def agora_mcp(
    *argv: str, token: str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("AGORA_TOKEN", None)
    if token is not None:
        env["AGORA_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "hub", "mcp", *argv],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path_factory.mktemp("mcp-cli"))
    yield starter.start()
    starter.close()


def test_backend_flags() -> None:
    assert parse_backends([]) == dict(DEFAULT_BACKENDS)
    assert parse_backends(["shell=sh", "python=py-1"])["shell"] == "sh"
    for bad in ("bash=sh", "shell", "shell=bad id"):
        with pytest.raises(BadRequest):
            parse_backends([bad])


def test_refusals_exit_2_and_keep_stdout_clean(hub: HubProcess) -> None:
    missing = agora_mcp("--url", hub.url)
    assert (missing.returncode, missing.stdout) == (2, "")
    assert "AGORA_TOKEN" in missing.stderr
    forged = agora_mcp("--url", hub.url, token="not-a-token")
    assert (forged.returncode, forged.stdout) == (2, "")
    assert "agora mcp: error:" in forged.stderr
    bad_ws = agora_mcp("--url", hub.url, "--workspace", "../x", token=hub.token())
    assert bad_ws.returncode == 2


def test_unreachable_hub_exits_1(tmp_path: Path) -> None:
    down = agora_mcp("--url", "ws://127.0.0.1:9", token="t")
    assert (down.returncode, down.stdout) == (1, "")


def test_stdin_eof_ends_it_cleanly(hub: HubProcess) -> None:
    done = agora_mcp("--url", hub.url, token=hub.token())
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


async def test_token_from_the_flag(hub: HubProcess) -> None:
    async with mcp_stdio(hub, "ignored-env-token", args=["--token", hub.token("erin")]) as s:
        posted = structured(await s.call_tool("post_message", {"workspace": "cli", "text": "x"}))
    assert posted["kind"] == "messagePosted"
