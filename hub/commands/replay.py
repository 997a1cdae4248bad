"""``agora replay WORKSPACE``: the workspace's log as a readable timeline, one line per event.

Streams: the log is read a page at a time, so a long log is never held in memory (only the
workspace projection is, to number file revisions). ``--json`` prints the stored envelopes
verbatim, one per line.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Final

import msgspec

from hub.commands._audit import (
    EXIT_OK,
    PAGE,
    add_store_args,
    add_workspace_arg,
    require_head,
    seq_number,
    with_store,
    write_bytes,
)
from hub.commands.timeline import Timeline, parse_time
from hub.core.projections.workspace import WorkspaceState
from hub.log.base import EventStore
from hub.log.loading import load_state

COMMAND = "replay"


class _Stamp(msgspec.Struct):
    """The one field ``--json --until-time`` needs from a stored envelope."""

    timestamp: int = 0


_stamp: Final = msgspec.json.Decoder(_Stamp)


def _time_arg(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="print a workspace's log as a readable timeline",
        description=(
            "Print the log of WORKSPACE, one event per line: time (UTC), seq, producer, kind "
            "and a one-line summary. --json prints the stored envelopes (JSON Lines)."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument(
        "--after-seq",
        type=seq_number,
        default=0,
        metavar="N",
        help="start after seq N (default: 0, the beginning)",
    )
    until = parser.add_mutually_exclusive_group()
    until.add_argument(
        "--until-seq", type=seq_number, default=None, metavar="N", help="stop after seq N"
    )
    until.add_argument(
        "--until-time",
        type=_time_arg,
        default=None,
        metavar="ISO",
        help="stop before the first event stamped after this time (ISO 8601; UTC if no offset)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the stored envelopes, one JSON per line"
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        await require_head(store, args.workspace)
        if args.json:
            await _replay_json(
                store, args.workspace, args.after_seq, args.until_seq, args.until_time
            )
        else:
            await _replay_text(
                store, args.workspace, args.after_seq, args.until_seq, args.until_time
            )
        return EXIT_OK

    return await with_store(COMMAND, args, body)


async def _replay_text(
    store: EventStore, workspace: str, after: int, until_seq: int | None, until_ms: int | None
) -> None:
    # The fold starts where the timeline does, so file revisions are numbered as in the log.
    state = (
        await load_state(store, workspace, at_seq=after)
        if after
        else WorkspaceState(workspace=workspace)
    )
    timeline = Timeline(state)
    line = timeline.line
    async with contextlib.aclosing(
        store.pages(workspace, after_seq=after, until_seq=until_seq, batch=PAGE)
    ) as pages:
        async for page in pages:
            if until_ms is not None:
                stop = next((i for i, ev in enumerate(page) if ev.timestamp > until_ms), None)
                if stop is not None:
                    _print([line(ev) for ev in page[:stop]])
                    return
            _print([line(ev) for ev in page])


async def _replay_json(
    store: EventStore, workspace: str, after: int, until_seq: int | None, until_ms: int | None
) -> None:
    while True:
        page = await store.read_raw(workspace, after_seq=after, limit=PAGE)
        bodies: list[bytes] = []
        for seq, body in page:
            if (until_seq is not None and seq > until_seq) or (
                until_ms is not None and _stamp.decode(body).timestamp > until_ms
            ):
                _write(bodies)
                return
            bodies.append(body)
        _write(bodies)
        if len(page) < PAGE:
            return
        after = page[-1][0]


def _print(lines: list[str]) -> None:
    if lines:
        print("\n".join(lines))


def _write(bodies: list[bytes]) -> None:
    if bodies:
        write_bytes(b"\n".join(bodies) + b"\n")
