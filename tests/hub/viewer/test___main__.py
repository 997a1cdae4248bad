"""``python3 -m hub.viewer``: the freshness check ``scripts/test`` runs, and the hash it checks."""

from __future__ import annotations

import subprocess
import sys

from hub.viewer.build import source_hash
from tests.support.paths import REPO


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub.viewer", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_passes_on_the_committed_build() -> None:
    done = run("--check")
    assert done.returncode == 0, done.stderr
    assert "matches" in done.stdout


def test_without_check_it_prints_the_source_hash() -> None:
    done = run()
    assert done.returncode == 0 and done.stdout.strip() == source_hash()
