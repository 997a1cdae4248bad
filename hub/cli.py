"""The ``agora`` command line. ``main(argv=None)`` is the only place that calls ``asyncio.run``.

Each subcommand lives in its own module under :mod:`hub.commands` and exposes
``register(subparsers)``; it sets ``func`` (a coroutine function taking the parsed args and
returning an exit code) on its parser.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Sequence

from hub import __version__

# Modules under hub.commands, in the order `agora --help` lists them.
COMMANDS: tuple[str, ...] = (
    "serve",
    "token",
    "append",
    "replay",
    "state",
    "verify",
    "checkpoint",
    "prove",
    "verify_proof",
    "witness",
    "export",
    "import_",
    "blobs",
    "workspaces",
    "db",
    "tool_schema",
    "images",
    "backends",
    "mcp",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agora",
        description="Agora: an event-sourced collaboration hub for multi-agent workspaces.",
    )
    parser.add_argument("--version", action="version", version=f"agora {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"hub.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    # What followed the command's name, as given (`agora serve --workers N` starts each worker
    # with its own serve arguments): the parser takes no option before the command.
    args.command_argv = given[given.index(args.command) + 1 :] if args.command in given else []
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = asyncio.run(func(args))
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
