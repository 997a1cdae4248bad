"""``agora backends``: the backend instances a hub with this configuration runs code on.

One line per instance (``[[backends]]`` in the config file, or the default set): its id (``*``
marks the default, what ``exec`` without ``backend`` runs on), kind, access, whether it can run
here (and why not), its isolation class, languages and the controls it enforces. Probing has
no side effects on a running hub: a container instance only asks the engine whether it answers
and has the image. ``--json`` prints the same as a JSON array
(``hub.runtime.registry.BackendInfo``).
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from hub.commands.common import add_config_arg, config_from_args, fail
from hub.core.errors import AgoraError

COMMAND = "backends"
EXIT_OK = 0

_ENFORCES = ("network", "filesystem", "environment", "timeout", "memory", "pids", "cpu")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="list the backend instances with their capabilities and availability",
        description="List the execution backend instances of the configuration (default: one "
        "of each kind), their capabilities, and whether each can run here (and why not).",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    add_config_arg(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    """Print the instances; 0, or 2 for a bad configuration."""
    from hub.runtime.registry import BackendRegistry

    try:
        config = config_from_args(args)
        registry = BackendRegistry.from_config(config.backends)
    except AgoraError as e:
        return fail(COMMAND, e)
    async with registry:
        rows = await registry.describe()
    if args.json:
        print(msgspec.json.encode(rows).decode())
    else:
        print("\n".join(render([msgspec.to_builtins(r) for r in rows])))
    return EXIT_OK


def render(rows: list[dict[str, Any]]) -> list[str]:
    """An aligned table, then one ``why`` line per unavailable instance (pure)."""
    table = [("ID", "KIND", "ACCESS", "AVAILABLE", "ISOLATION", "LANGUAGES", "ENFORCES")]
    notes: list[str] = []
    for row in rows:
        caps = row["capabilities"]
        enforced = [c for c in _ENFORCES if caps.get(f"enforces{c.title()}")]
        table.append(
            (
                row["id"] + (" *" if row["default"] else ""),
                row["kind"],
                row["access"],
                "yes" if row["available"] else "no",
                caps.get("isolation", "?"),
                ",".join(sorted(caps.get("languages", []))) or "-",
                ",".join(enforced) or "-",
            )
        )
        if not row["available"]:
            notes.append(f"{row['id']}: unavailable: {row['reason']}")
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table
    ]
    return lines + (["", *notes] if notes else []) + ["", "* the default backend"]
