"""``agora token issue`` and ``agora token inspect``: capability tokens for operators.

``issue`` signs a token with the data directory's secret (creating the secret on first use) and
prints it as one line; ``inspect`` verifies a token and prints its claims. Exit codes: 0 done,
1 the token did not verify (``inspect``), 2 bad input or configuration.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Final

import msgspec

from hub.auth import MAX_TTL_SECONDS, TokenSigner, load_or_create_secret, load_secret
from hub.commands.common import add_config_arg, add_data_args, data_dir_from_args, fail
from hub.core.capability import (
    RIGHTS,
    Capability,
    normalize_backends,
    normalize_rights,
    normalize_workspaces,
)
from hub.core.errors import AgoraError, BadRequest, Unauthorized
from hub.core.validation import validate_id

DEFAULT_TTL: Final = "1h"
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION_RE: Final = re.compile(r"(?P<n>[0-9]{1,9})(?P<unit>[smhdw]?)")


def register(subparsers: Any) -> None:
    """Add ``token issue`` and ``token inspect`` to the ``agora`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "token", help="issue and inspect capability tokens"
    )
    commands = parser.add_subparsers(dest="token_command", metavar="ACTION", required=True)

    issue = commands.add_parser(
        "issue",
        help="sign a capability token and print it",
        description="Sign a capability token with the hub secret and print it on one line.",
    )
    issue.add_argument("--agent", required=True, help="agent id (the token's subject)")
    issue.add_argument(
        "--workspace",
        dest="workspaces",
        action="append",
        required=True,
        metavar="W",
        help="workspace the token grants (repeat or comma-separate for more; '*' for all)",
    )
    issue.add_argument(
        "--rights",
        required=True,
        help=f"comma-separated rights from {','.join(RIGHTS)} (admin implies all)",
    )
    issue.add_argument(
        "--backends",
        default="",
        help="comma-separated backend ids the holder may run code on, or '*' (default: none)",
    )
    issue.add_argument(
        "--ttl",
        default=DEFAULT_TTL,
        help=f"lifetime: seconds, or a number and s/m/h/d/w, e.g. 30m, 7d (default: {DEFAULT_TTL})",
    )
    issue.add_argument("--json", action="store_true", help="print the token and its claims")
    add_data_args(issue)
    add_config_arg(issue)
    issue.set_defaults(func=issue_command)

    inspect = commands.add_parser(
        "inspect",
        help="verify a token and print its claims",
        description="Verify a token against the hub secret and print its claims as JSON.",
    )
    inspect.add_argument("token", metavar="TOKEN")
    add_data_args(inspect)
    add_config_arg(inspect)
    inspect.set_defaults(func=inspect_command)


def parse_ttl(text: str) -> int:
    """Seconds in ``3600``, ``90s``, ``30m``, ``1h``, ``7d`` or ``2w``. Raises
    :class:`BadRequest` (field ``ttl``) for anything else, zero, or more than 366 days."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None or int(match["n"]) == 0:
        raise BadRequest(
            f"invalid ttl {text!r}: use a positive number of seconds or e.g. 30m, 1h, 7d",
            field="ttl",
        )
    seconds = int(match["n"]) * _UNITS[match["unit"] or "s"]
    if seconds > MAX_TTL_SECONDS:
        raise BadRequest(
            f"ttl must be 1-{MAX_TTL_SECONDS} seconds (366 days); {text!r} is longer",
            field="ttl",
            limit=MAX_TTL_SECONDS,
        )
    return seconds


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


async def issue_command(args: argparse.Namespace) -> int:
    """``agora token issue``: print a new token (and, with ``--json``, its claims)."""
    try:
        # Check every input before touching the data directory: bad input changes nothing.
        ttl = parse_ttl(args.ttl)
        agent = validate_id(args.agent, "agent")
        workspaces = normalize_workspaces(w for arg in args.workspaces for w in split_list(arg))
        rights = normalize_rights(split_list(args.rights))
        backends = normalize_backends(split_list(args.backends))
        data_dir = data_dir_from_args(args)
        signer = TokenSigner(load_or_create_secret(data_dir, os.environ))
        token = signer.issue(agent, workspaces, rights, backends=backends, ttl_seconds=ttl)
        capability = signer.verify(token)
    except AgoraError as e:
        return fail("token issue", e)
    if args.json:
        _print_json({"token": token, "capability": capability})
    else:
        print(token)
    return 0


async def inspect_command(args: argparse.Namespace) -> int:
    """``agora token inspect``: verify a token and print its capability as JSON; exit 1 if it
    does not verify."""
    try:
        signer = TokenSigner(load_secret(data_dir_from_args(args), os.environ))
    except AgoraError as e:
        return fail("token inspect", e)
    try:
        capability: Capability = signer.verify(args.token.strip())
    except Unauthorized as e:
        return fail("token inspect", f"{e.details['reason']}: {e.message}", code=1)
    _print_json(capability)
    return 0


def _print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value)).decode() + "\n")
