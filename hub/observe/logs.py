"""The hub's log lines on stderr: text (default) or JSON Lines (``--log-format json``).

JSON: one object per line with ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``msg``, the
exception text as ``exc`` when there is one, and the context fields a log call passes in
``extra`` — :data:`FIELDS` (``workspace``, ``seq``, ``agent``, ``execId``, ``code``, ``peer``)
— so that a log pipeline can filter by workspace or agent without parsing the message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

__all__ = ["FIELDS", "LOG_FORMATS", "JsonFormatter", "configure"]

LogFormat = Literal["text", "json"]
LOG_FORMATS: Final[tuple[LogFormat, ...]] = ("text", "json")
FIELDS: Final = ("workspace", "seq", "agent", "execId", "code", "peer")
"""The context fields a log call may give in ``extra`` (kept as keys of the JSON line)."""

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(fmt: LogFormat = "text", stream: TextIO | None = None) -> None:
    """The root logger at INFO on ``stream`` (stderr) in ``fmt``; websockets' own at WARNING.
    A root logger that already has handlers (a test's) keeps them."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("websockets").setLevel(logging.WARNING)
