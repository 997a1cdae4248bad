"""``agora append WORKSPACE``: append event drafts from stdin (JSON Lines) as one atomic batch.

The batch goes through :meth:`hub.workspaces.Workspaces.publish`, the write path the server
uses, so the same validation and decide rules apply (producer ``cli`` unless ``--producer``;
never trusted, so hub-only kinds are refused). Every line is decoded before anything is
published, and the batch is atomic: on any error nothing of it is written.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from hub.commands._audit import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_store_args,
    add_workspace_arg,
    agent_id,
    decode_lines,
    locate,
    read_input,
    report,
    report_all,
    seq_number,
    with_store,
)
from hub.commands.common import config_from_args, fail
from hub.core.errors import AgoraError, BadRequest, ConfigError
from hub.core.events import Event
from hub.core.records import AppendResult
from hub.core.validation import validate_draft
from hub.log.base import EventStore
from hub.workspaces import Workspaces

COMMAND = "append"
DEFAULT_PRODUCER = "cli"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="append event drafts read from stdin (JSON Lines) as one atomic batch",
        description=(
            "Read event drafts, one JSON object per line (blank lines ignored), from stdin and "
            "append them as ONE atomic batch with the server's validation and rules. Prints "
            "'SEQ ID' per event. On any error nothing is appended."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument(
        "--producer",
        type=agent_id,
        default=DEFAULT_PRODUCER,
        metavar="ID",
        help=f"the producer recorded on the events (default: {DEFAULT_PRODUCER})",
    )
    parser.add_argument(
        "--expected-seq",
        type=seq_number,
        default=None,
        metavar="N",
        help="append only if the workspace's head is N (optimistic concurrency)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    workspace: str = args.workspace
    try:
        limits = config_from_args(args).limits
        data = read_input(None)
    except (BadRequest, ConfigError) as e:  # ConfigError
        return report(COMMAND, e, EXIT_USAGE)
    except AgoraError as e:
        return report(COMMAND, e)
    draft_limits = limits.draft_limits()

    def check(ev: Event) -> None:
        """Field checks per line, so every bad line is named (publish stops at the first)."""
        if ev.workspace and ev.workspace != workspace:
            raise BadRequest(
                f"the event names workspace {ev.workspace!r}, not {workspace!r}",
                field="workspace",
            )
        validate_draft(ev, draft_limits)

    numbered, errors = decode_lines(data, check, max_depth=draft_limits.max_depth)
    if errors:
        return report_all(COMMAND, errors)
    if not numbered:
        return report(COMMAND, BadRequest("no events on stdin", field="events"))
    lines = [line for line, _ in numbered]
    drafts = [ev for _, ev in numbered]

    async def body(store: EventStore) -> int:
        workspaces = Workspaces(store, limits=draft_limits, snapshot_every=limits.snapshot_every)
        try:
            result = await workspaces.publish(
                workspace, drafts, producer=args.producer, expected_seq=args.expected_seq
            )
        except AgoraError as e:
            index = e.details.get("index")
            line = lines[index] if isinstance(index, int) and 0 <= index < len(lines) else None
            return fail(COMMAND, locate(e, line), EXIT_FAILED)
        finally:
            await workspaces.aclose()
        _print_result(result, as_json=args.json)
        return EXIT_OK

    return await with_store(COMMAND, args, body, read_only=False)


def _print_result(result: AppendResult, *, as_json: bool) -> None:
    if as_json:
        body = {
            "workspace": result.workspace,
            "seqs": result.seqs,
            "ids": result.ids,
            "duplicate": result.duplicate,
        }
        print(msgspec.json.encode(body).decode())
        return
    if result.duplicate:
        print(
            f"agora {COMMAND}: note: every event id was already written; nothing appended",
            file=sys.stderr,
        )
    print("\n".join(f"{ev.seq} {ev.id}" for ev in result.events))
