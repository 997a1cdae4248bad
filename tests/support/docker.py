"""The Docker Engine of the tests: whether it answers, and the owner label of the containers
this test process creates (so a sweep never touches another run's)."""

from __future__ import annotations

import os
from typing import Final

from tests.support.require import require

TEST_OWNER: Final = f"agora-test-{os.getpid()}"


def docker_available() -> tuple[bool, str]:
    """Whether an engine answers (and why not); the container backend's own probe. Blocking."""
    from backends.container import engine_reachable  # the docker SDK loads only when asked

    return engine_reachable()


def need_docker() -> None:
    """Skip without an engine (fail when ``AGORA_REQUIRE`` lists docker)."""
    ok, why = docker_available()
    require("docker", ok, why)
