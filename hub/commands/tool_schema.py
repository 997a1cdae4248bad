"""``agora tool-schema``: print the ``code_exec`` tool's definition (JSON Schema of its
arguments) for an LLM API.

``--style plain`` (default) prints ``{name, description, parameters}``; ``anthropic`` uses
``input_schema``; ``openai`` wraps it as ``{"type": "function", "function": {...}}``.
``--parameters`` prints only the JSON Schema of the arguments. Exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from backends.code_tool import CODE_EXEC_PARAMETERS, tool_definition

COMMAND = "tool-schema"
STYLES = ("plain", "anthropic", "openai")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="print the code_exec tool's JSON schema",
        description="Print the definition of the code_exec tool (languages rust, python, "
        "wasm, shell) with the JSON Schema of its arguments, for an LLM API.",
    )
    parser.add_argument(
        "--style", choices=STYLES, default="plain", help="definition layout (default: plain)"
    )
    parser.add_argument(
        "--parameters", action="store_true", help="print only the arguments' JSON Schema"
    )
    parser.set_defaults(func=tool_schema_command)


async def tool_schema_command(args: argparse.Namespace) -> int:
    document = CODE_EXEC_PARAMETERS if args.parameters else tool_definition(args.style)
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n")
    return 0
