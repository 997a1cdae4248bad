"""``agora token issue|inspect|revoke|revoked``: capability tokens for operators.

``issue`` signs a token with the data directory's secret (creating the secret on first use) and
prints it as one line, refusing a ttl over ``[auth] max_token_ttl``; ``inspect`` verifies a
token and prints its claims. ``revoke`` appends a ``tokenRevoked`` event to the hub's system
workspace through the store (like ``agora append``; a running hub picks it up within a second
and closes the connections using the token); ``revoked`` lists the revocations. Exit codes: 0
done, 1 the token did not verify (``inspect``) or the store failed, 2 bad input or
configuration.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from hub.auth import TokenSigner, load_or_create_secret, load_secret
from hub.commands._audit import EXIT_OK, EXIT_USAGE, add_store_args, report, with_store
from hub.commands.common import add_config_arg, add_data_args, config_from_args, fail
from hub.core.capability import (
    MAX_TTL_SECONDS,
    RIGHTS,
    SYSTEM_WORKSPACE,
    Capability,
    normalize_backends,
    normalize_rights,
    normalize_workspaces,
)
from hub.core.errors import AgoraError, BadRequest, Unauthorized
from hub.core.events import TokenRevoked, encode_event
from hub.core.validation import validate_id
from hub.log.base import EventStore
from hub.revocations import read_revocations, revocation, revoke

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

    revoke = commands.add_parser(
        "revoke",
        help="revoke a token, or every token of an agent issued until now",
        description=(
            "Record a revocation (a tokenRevoked event in the hub's system workspace "
            f"{SYSTEM_WORKSPACE!r}). Hubs on this store refuse the token from then on and close "
            "the connections and streams using it within a second."
        ),
    )
    revoke.add_argument(
        "--token-id",
        metavar="ID",
        help="the token's id (jti; see inspect); write --token-id=ID for an id that starts with -",
    )
    revoke.add_argument(
        "--agent", metavar="A", help="revoke every token of agent A issued until now"
    )
    revoke.add_argument("--reason", metavar="TEXT", help="why (recorded in the log)")
    revoke.add_argument("--json", action="store_true", help="print the appended event as JSON")
    add_store_args(revoke)
    revoke.set_defaults(func=revoke_command)

    revoked = commands.add_parser(
        "revoked",
        help="list the revocations",
        description="List the revocations recorded in the hub's system workspace, oldest first.",
    )
    revoked.add_argument("--json", action="store_true", help="one JSON event per line")
    add_store_args(revoked)
    revoked.set_defaults(func=revoked_command)


def parse_ttl(text: str, max_ttl: int = MAX_TTL_SECONDS) -> int:
    """Seconds in ``3600``, ``90s``, ``30m``, ``1h``, ``7d`` or ``2w``. Raises
    :class:`BadRequest` (field ``ttl``) for anything else, zero, or more than ``max_ttl``
    seconds (``[auth] max_token_ttl``)."""
    match = _DURATION_RE.fullmatch(text.strip())
    if match is None or int(match["n"]) == 0:
        raise BadRequest(
            f"invalid ttl {text!r}: use a positive number of seconds or e.g. 30m, 1h, 7d",
            field="ttl",
        )
    seconds = int(match["n"]) * _UNITS[match["unit"] or "s"]
    if seconds > max_ttl:
        raise BadRequest(
            f"ttl {text!r} is longer than the maximum of {max_ttl} seconds ([auth] max_token_ttl)",
            field="ttl",
            limit=max_ttl,
        )
    return seconds


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``."""
    return [item.strip() for item in text.split(",") if item.strip()]


async def issue_command(args: argparse.Namespace) -> int:
    """``agora token issue``: print a new token (and, with ``--json``, its claims)."""
    try:
        # Check every input before touching the data directory: bad input changes nothing.
        config = config_from_args(args)
        max_ttl = config.auth.max_token_ttl
        ttl = parse_ttl(args.ttl, max_ttl)
        agent = validate_id(args.agent, "agent")
        workspaces = normalize_workspaces(w for arg in args.workspaces for w in split_list(arg))
        rights = normalize_rights(split_list(args.rights))
        backends = normalize_backends(split_list(args.backends))
        secret = load_or_create_secret(config.storage.data_dir, os.environ)
        signer = TokenSigner(secret, max_ttl=max_ttl)
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
        config = config_from_args(args)
        secret = load_secret(config.storage.data_dir, os.environ)
        signer = TokenSigner(secret, max_ttl=config.auth.max_token_ttl)
    except AgoraError as e:
        return fail("token inspect", e)
    try:
        capability: Capability = signer.verify(args.token.strip())
    except Unauthorized as e:
        return fail("token inspect", f"{e.details['reason']}: {e.message}", code=1)
    _print_json(capability)
    return 0


async def revoke_command(args: argparse.Namespace) -> int:
    """``agora token revoke``: append the revocation; print ``SEQ ID`` (or the event)."""
    command = "token revoke"
    try:
        payload = revocation(
            token_id=args.token_id,
            agent=args.agent,
            # Whole seconds, like iat: a token issued earlier in this second is revoked too.
            before=int(time.time()) if args.agent is not None else None,
            reason=args.reason,
        )
    except BadRequest as e:
        return report(command, e, EXIT_USAGE)

    async def body(store: EventStore) -> int:
        result = await revoke(store, payload)
        event = result.events[0]
        if args.json:
            sys.stdout.write(encode_event(event).decode() + "\n")
        else:
            print(f"{event.seq} {event.id}")
        return EXIT_OK

    return await with_store(command, args, body, read_only=False)


async def revoked_command(args: argparse.Namespace) -> int:
    """``agora token revoked``: one line per revocation, oldest first."""

    async def body(store: EventStore) -> int:
        for event in await read_revocations(store):
            if args.json:
                sys.stdout.write(encode_event(event).decode() + "\n")
            else:
                print(describe(event))
        return EXIT_OK

    return await with_store("token revoked", args, body, read_only=True)


def describe(event: TokenRevoked) -> str:
    """``SEQ TIME tokenId=… agent=… before=… reason=…`` (the fields present)."""
    p = event.payload
    at = datetime.fromtimestamp(event.timestamp / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    parts = [str(event.seq), at]
    if p.token_id is not None:
        parts.append(f"tokenId={p.token_id}")
    if p.agent is not None:
        parts.append(f"agent={p.agent}")
    if p.before is not None:
        parts.append(f"before={p.before}")
    if p.reason is not None:
        parts.append(f"reason={msgspec.json.encode(p.reason).decode()}")
    return " ".join(parts)


def _print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value)).decode() + "\n")
