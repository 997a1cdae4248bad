"""The viewer's Vitest unit tests (web/src/*.test.ts: the timeline's filters, routes and deep
links, derived views, the protocol layer), run from the suite: ``npm ci && npx vitest run``."""

from __future__ import annotations

import subprocess

from hub.viewer.build import WEB_DIR
from tests.support.require import require, require_node

NPM_TIMEOUT = 300


def test_vitest_unit_tests_pass() -> None:
    npm = require_node()
    install = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=WEB_DIR,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT,
    )
    if install.returncode != 0:
        require("node", False, f"npm ci failed: {install.stderr.strip()[-300:]}")
    run = subprocess.run(
        ["npx", "vitest", "run", "--reporter=dot"],
        cwd=WEB_DIR,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
