"""The hub under attack: :func:`open_door` starts it (WebSocket port and HTTP port: A2A,
``/mcp``, ``/ui``), and after the attacks checks that it restarts cleanly and that
``agora verify`` exits 0 with no traceback anywhere."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.support.hub import HubProcess, HubStarter
from tests.support.paths import REPO
from tests.support.postgres import drop_schemas, need_postgres, new_schema, url_for
from tests.support.tokens import SECRET

HELLO_TIMEOUT_S: Final = 3.0
MAX_CONNECTIONS: Final = 400

DOOR_CONFIG: Final = f"""
[server]
presence_grace_s = 0.5

[limits]
hello_timeout_s = {HELLO_TIMEOUT_S}
max_connections = {MAX_CONNECTIONS}
"""


@dataclass
class Door:
    hub: HubProcess
    store: str  # "sqlite" or "postgres"
    store_url: str | None

    def verify(self) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "hub", "verify", "--data", str(self.hub.data_dir)]
        if self.store_url is not None:
            argv += ["--store", self.store_url]
        return subprocess.run(
            argv,
            cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "AGORA_SECRET": SECRET},
            capture_output=True,
            text=True,
            timeout=120,
        )


def open_door(store: str, root: Path) -> Iterator[Door]:
    schema: str | None = None
    config = DOOR_CONFIG
    url: str | None = None
    if store == "postgres":
        need_postgres()
        schema = new_schema("adv")
        url = url_for(schema)
        config = f'[storage]\nstore = "{url}"\n' + config
    starter = HubStarter(root)
    try:
        hub = starter.start(config, a2a_port=0)
        yield Door(hub, store, url)
        # After every attack: a clean stop, a clean start on the same data, a clean verify.
        assert hub.terminate() == 0, hub.log()
        hub.restart()  # on the same ports (WebSocket and HTTP)
        assert hub.terminate() == 0, hub.log()
        verified = Door(hub, store, url).verify()
        assert verified.returncode == 0, (verified.stdout[-3000:], verified.stderr[-3000:])
        assert "Traceback" not in verified.stderr, verified.stderr[-3000:]
        assert "Traceback" not in hub.stderr_path.read_text(errors="replace"), hub.log()
    finally:
        starter.close()
        if schema is not None:
            drop_schemas([schema])
