"""One real ``agora serve`` per store (SQLite, PostgreSQL) that every adversarial test of the
module attacks; afterwards it must restart cleanly on the same data and ``agora verify`` exit 0.

The hub runs with its HTTP port (A2A, ``/mcp``, ``/ui``), a short ``hello`` deadline and a
connection cap the tests can reach (see :data:`tests.adversarial.door.DOOR_CONFIG`), the other
limits at their defaults.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adversarial.door import Door, open_door


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def door(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Door]:
    yield from open_door(str(request.param), tmp_path_factory.mktemp(f"door-{request.param}"))
