"""Fixtures for the runtime's black-box tests: a real ``agora serve`` subprocess over real
sockets (:class:`tests.support.hub.HubProcess`), driven with raw connections
(:class:`tests.support.peer.ExecPeer`), and the real Docker Engine for the container backend.

Tests name the backend instances they need in an ``agora.toml`` (:data:`BACKENDS`); a token
minted by :func:`tests.support.tokens.mint_exec` carries the ``exec`` right and the backends it
may select.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hub import HubProcess, HubStarter, StartHub

BACKENDS = """
[[backends]]
id = "process"
kind = "process"
access = "read-write"

[[backends]]
id = "container"
kind = "container"
access = "read-write"
limits = { memory_bytes = 67108864, pids = 64, warm_pool = 1 }

[[backends]]
id = "ro"
kind = "process"
access = "read"

[[backends]]
id = "python"
kind = "python"
access = "read-write"
"""
"""The instances most tests use: ``process`` first (the default), a ``container`` with a
64 MiB memory and 64 pids limit, a read-only ``ro`` process instance and ``python`` (monty)."""


@pytest.fixture
def start_runtime_hub(tmp_path: Path) -> Iterator[StartHub]:
    """``start_runtime_hub(config=BACKENDS, data_dir=None, args=())``: a running ``agora serve``
    with that agora.toml (and extra flags such as ``--max-executions``); each is stopped with
    SIGTERM at the end (and must exit 0) unless the test killed it."""
    starter = HubStarter(tmp_path)

    def start(
        config: str = BACKENDS, data_dir: Path | None = None, args: tuple[str, ...] = ()
    ) -> HubProcess:
        return starter.start(config, data_dir=data_dir, args=args)

    yield start
    starter.close()


@pytest.fixture
def runtime_hub(start_runtime_hub: StartHub) -> HubProcess:
    return start_runtime_hub()
