"""hub.observe.logs: ``agora serve --log-format json`` writes one JSON object per stderr line,
with the workspace, seq, agent and execId of the lines about an execution or a connection."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub.commands.serve import TRACE_EXPORTERS
from hub.observe.logs import JsonFormatter
from hub.observe.tracing import EXPORTERS
from tests.support.hub import HubStarter
from tests.support.peer import exec_peer

CONFIG = '[[backends]]\nid = "process"\nkind = "process"\n'


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[HubStarter]:
    hubs = HubStarter(tmp_path)
    yield hubs
    hubs.close()


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_json_logs_carry_the_execution_and_connection_fields(starter: HubStarter) -> None:
    hub = starter.start(CONFIG, args=["--log-format", "json"])
    async with exec_peer(hub.url) as p:
        result = await p.run(workspace="logs", source="echo hi")
        assert result["status"] == "completed", result
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = _lines(hub.log())  # every line is JSON, or this raises
        closes = [x for x in lines if x["msg"].startswith("close agent=")]
        if closes:
            break
        await asyncio.sleep(0.05)
    finished = [x for x in lines if x.get("execId") == result["execId"]]
    assert finished, lines
    line = finished[-1]
    assert (line["workspace"], line["agent"], line["level"]) == ("logs", "alice", "INFO")
    assert isinstance(line["seq"], int) and line["seq"] >= 2
    assert line["logger"] == "agora.runtime" and "completed" in line["msg"]
    assert closes and closes[-1]["agent"] == "alice" and closes[-1]["code"] == 1000
    assert all({"ts", "level", "logger", "msg"} <= set(x) for x in lines)


def test_the_formatter_keeps_known_fields_and_exceptions() -> None:
    record = logging.LogRecord("agora.x", logging.ERROR, __file__, 1, "boom %s", ("now",), None)
    record.__dict__.update(workspace="w", seq=7, secret="not a field")
    try:
        raise ValueError("why")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert (line["msg"], line["workspace"], line["seq"]) == ("boom now", "w", 7)
    assert "secret" not in line and "ValueError: why" in line["exc"]


def test_the_traces_flag_offers_every_exporter() -> None:
    assert TRACE_EXPORTERS == EXPORTERS
