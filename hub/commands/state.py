"""``agora state WORKSPACE [--at-seq N]``: the projected state, now or at any earlier seq.

Time travel uses the same loader as the server (newest snapshot at or before the seq, plus
the log after it); snapshots are caches, so the output is the same with or without them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from hub.commands._audit import (
    EXIT_OK,
    add_store_args,
    add_workspace_arg,
    require_head,
    seq_number,
    with_store,
)
from hub.commands.timeline import format_size, printable
from hub.core.projections.workspace import WorkspaceState
from hub.log.base import EventStore
from hub.log.loading import load_state

COMMAND = "state"

# Sorted keys at every level, so equal states print byte-identical JSON.
_json: Final = msgspec.json.Encoder(order="deterministic")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="print a workspace's projected state, now or at an earlier seq",
        description=(
            "Print the state of WORKSPACE (files, work items, members, executions, artifacts) "
            "as of its head or --at-seq N. --json prints the full state."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument(
        "--at-seq",
        type=seq_number,
        default=None,
        metavar="N",
        help="the state after seq N (time travel; default: the head)",
    )
    parser.add_argument("--json", action="store_true", help="print the full state as JSON")
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        head = await require_head(store, args.workspace)
        at_seq = head.seq if args.at_seq is None else min(args.at_seq, head.seq)
        state = await load_state(store, args.workspace, at_seq=at_seq)
        if args.json:
            print(_json.encode(state).decode())
        else:
            print("\n".join(render(state, head.seq)))
        return EXIT_OK

    return await with_store(COMMAND, args, body)


def render(state: WorkspaceState, head: int) -> list[str]:
    """The human summary of ``state`` (pure), sections in a fixed order, entries sorted.

    Every name is passed through :func:`~hub.commands.timeline.printable`, so one entry is one line.
    """
    p = printable
    where = "the head" if state.seq == head else f"head {head}"
    out = [f"workspace {state.workspace} at seq {state.seq} ({where})"]
    out += _section(
        "files",
        (
            f"{p(path)}  rev {f.rev}  {format_size(f.size)}  by {p(f.producer)} at seq {f.seq}"
            + ("  (blob)" if f.blob is not None else "")
            for path, f in sorted(state.files.items())
        ),
    )
    out += _section(
        "work items",
        (
            f"#{p(cid)}  {w.status}"
            + (f"  owner {p(w.owner)}" if w.owner is not None else "")
            + f"  requester {p(w.requester)}"
            + (f"  topic {p(w.topic)}" if w.topic is not None else "")
            + (f"  → {p(w.consumer)}" if w.consumer is not None else "")
            + f"  last {w.last_kind} by {p(w.last_producer)} at seq {w.updated_seq}"
            for cid, w in sorted(state.work_items.items())
        ),
    )
    out += _section(
        "members",
        (
            f"{p(agent)}  {'present' if m.present else 'left'}  via {p(m.via)}"
            + (f"  card {p(m.card_url)}" if m.card_url is not None else "")
            for agent, m in sorted(state.members.items())
        ),
    )
    out += _section(
        "executions",
        (
            f"{p(exec_id)}  {e.status}"
            + (f" {p(e.reason)}" if e.reason is not None and e.reason != "exit" else "")
            + (f" exit {e.exit_code}" if e.exit_code is not None else "")
            + f"  on {p(e.backend)}  by {p(e.requested_by)}"
            + ("  (disposed)" if e.disposed else "")
            for exec_id, e in sorted(state.executions.items())
        ),
    )
    out += _section(
        "artifacts",
        (
            f"{p(key)}  {p(a.media_type)}  {format_size(a.size_bytes)}"
            + f"  by {p(a.producer)} at seq {a.seq}"
            + (f"  exec {p(a.exec_id)}" if a.exec_id is not None else "")
            for key, a in sorted(state.artifacts.items())
        ),
    )
    out.append(f"messages: {state.messages}")
    return out


def _section(title: str, rows: Iterable[str]) -> list[str]:
    lines = [f"  {row}" for row in rows]
    return [f"{title}: {len(lines)}", *lines]
