"""A real ``agora serve`` with its HTTP port (the viewer is mounted there, docs/viewer.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hub import HubProcess, HubStarter


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    starter = HubStarter(tmp_path)
    yield starter.start(a2a_port=0)
    starter.close()
