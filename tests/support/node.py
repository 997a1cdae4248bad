"""The TypeScript client (``clients/typescript``, npm package ``@agora-hub/client``) for
Python tests: find Node.js and npm, install the package's dependencies (``npm ci``, kept in
``clients/typescript/node_modules``, gitignored) and build it (``dist/``), and run its example
agent (``examples/agent.mjs``) against a hub.

``require_node()`` skips a test without Node.js 20+ and npm (or fails it when ``AGORA_REQUIRE``
lists ``node``). :func:`build` is safe to call from several tests and processes: a lock file
serialises the installs and builds, and ``npm ci`` runs only when ``package-lock.json`` changed
since the last install.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tests.support.paths import REPO
from tests.support.require import require

CLIENT_DIR: Final = REPO / "clients" / "typescript"
AGENT: Final = CLIENT_DIR / "examples" / "agent.mjs"
MIN_NODE: Final = 20
INSTALL_TIMEOUT: Final = 600.0
BUILD_TIMEOUT: Final = 300.0


def node_version(node: str) -> int | None:
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return int(out.strip().lstrip("v").split(".")[0])
    except ValueError:
        return None


def require_node() -> tuple[str, str]:
    """Paths of ``node`` (20 or later) and ``npm``; skip (or fail) the test without them."""
    node, npm = shutil.which("node"), shutil.which("npm")
    require("node", node is not None and npm is not None, "node and npm are not on PATH")
    assert node is not None and npm is not None
    version = node_version(node)
    require("node", version is not None and version >= MIN_NODE, f"node {version} < {MIN_NODE}")
    return node, npm


def _run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(
        list(argv),
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
    )
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stdout[-4000:]}{proc.stderr[-4000:]}"


def build(npm: str) -> None:
    """``npm ci`` (when the lock file changed since the last install) and ``npm run build``."""
    # The lock is beside node_modules, not in it: ``npm ci`` deletes node_modules first.
    with (CLIENT_DIR / ".agora-build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install/build at a time (xdist, two suites)
        stamp = CLIENT_DIR / "node_modules" / ".agora-installed"
        wanted = (CLIENT_DIR / "package-lock.json").read_text()
        if not stamp.exists() or stamp.read_text() != wanted:
            _run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], INSTALL_TIMEOUT)
            stamp.write_text(wanted)  # written last: an interrupted install is redone
        _run([npm, "run", "--silent", "build"], BUILD_TIMEOUT)


def built_node() -> str:
    """The path of ``node`` with the package installed and built (:func:`build`); skips (or
    fails) the test as :func:`require_node` does. The body of the tests' ``node`` fixtures."""
    node, npm = require_node()
    build(npm)
    return node


def node_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for node processes: ``PYTHON`` (for the node tests' hubs) and the
    repository on ``PYTHONPATH`` (they run ``python -m hub`` from this checkout)."""
    env = dict(os.environ, PYTHON=sys.executable, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("PYTHONASYNCIODEBUG", None)
    return env


def run_agent(
    node: str,
    url: str,
    token: str,
    workspace: str,
    action: str,
    args: Mapping[str, Any] | None = None,
    *,
    timeout: float = 60.0,
) -> tuple[int, Any]:
    """Run ``examples/agent.mjs`` once (after :func:`build`); its exit code and the JSON it
    printed (``{"error": code, …}`` with exit code 1 on an error)."""
    proc = subprocess.run(
        [node, str(AGENT), url, token, workspace, action, json.dumps(dict(args or {}))],
        cwd=CLIENT_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=node_env(),
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"agent.mjs {action} printed nothing (exit {proc.returncode}): {proc.stderr}"
    return proc.returncode, json.loads(lines[-1])


def dist_is_built() -> bool:
    return (CLIENT_DIR / "dist" / "index.js").is_file()


__all__ = [
    "AGENT",
    "CLIENT_DIR",
    "build",
    "built_node",
    "dist_is_built",
    "node_env",
    "require_node",
    "run_agent",
]
