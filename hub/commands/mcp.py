"""``agora mcp``: an MCP server on stdin/stdout for one agent (docs/mcp.md).

::

    agora mcp --url ws://127.0.0.1:8765 --token "$TOKEN" --workspace demo

Connects to the hub with the token (also read from ``$AGORA_TOKEN``, which keeps it out of the
process list), then serves the Model Context Protocol on stdio until stdin closes: every tool
call acts as the token's agent. Nothing but MCP messages goes to stdout; logs go to stderr.
Exit 0 when stdin closes, 2 for bad arguments or a refused token, 1 when the hub cannot be
reached.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Final

from hub.commands.common import fail
from hub.core.errors import AgoraError, BadRequest, Unavailable
from hub.core.validation import validate_backend_id, validate_workspace

COMMAND: Final = "mcp"
TOKEN_ENV: Final = "AGORA_TOKEN"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="serve MCP (Model Context Protocol) on stdio for one agent",
        description="Serve the Model Context Protocol on stdin/stdout: Agora's files, messages, "
        "work items, timeline and code_exec as MCP tools and resources, acting as the "
        "token's agent (docs/mcp.md).",
    )
    parser.add_argument(
        "--url", default="ws://127.0.0.1:8765", help="the hub (default: ws://127.0.0.1:8765)"
    )
    parser.add_argument("--token", default=None, help=f"a capability token (default: ${TOKEN_ENV})")
    parser.add_argument(
        "--workspace", default=None, help="the workspace tool calls use when they name none"
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="LANG=ID",
        help="run code_exec's LANG (rust, python, wasm, shell) on backend instance ID "
        "(default: the instance named after the kind; shell: process); repeatable",
    )
    parser.set_defaults(func=mcp_command)


def parse_backends(given: list[str]) -> dict[str, str]:
    """``["shell=sh", …]`` over the defaults. Raises ``BadRequest``."""
    from backends.code_tool import LANGUAGES
    from hub.mcp.tools import DEFAULT_BACKENDS

    out = dict(DEFAULT_BACKENDS)
    for item in given:
        language, sep, backend = item.partition("=")
        if not sep or language not in LANGUAGES:
            raise BadRequest(f"--backend wants LANG=ID with LANG one of {', '.join(LANGUAGES)}")
        out[language] = validate_backend_id(backend)
    return out


async def mcp_command(args: argparse.Namespace) -> int:
    # Imported here: `agora --help` does not load the MCP SDK.
    from hub.client import connect
    from hub.mcp.server import serve_stdio
    from hub.mcp.tools import AgentLink

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        return fail(COMMAND, f"give --token or set ${TOKEN_ENV}")
    try:
        backends = parse_backends(args.backend)
        workspace = None if args.workspace is None else validate_workspace(args.workspace)
    except AgoraError as e:
        return fail(COMMAND, e)
    try:
        async with connect(args.url, token) as session:
            link = AgentLink(session, workspace, backends)
            await serve_stdio(link)
    except Unavailable as e:
        return fail(COMMAND, e, code=1)
    except AgoraError as e:
        return fail(COMMAND, e)
    return 0
