"""``agora workspaces``: every workspace with its head and last activity (from the heads), and
the ones the last start quarantined (from the recovery index, hub.runtime.recovery_index)."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from hub.commands._audit import EXIT_OK, add_store_args, with_store
from hub.commands.timeline import format_time
from hub.core.records import Head
from hub.log.base import EventStore
from hub.runtime.recovery_index import load_quarantined

COMMAND = "workspaces"


class WorkspaceRow(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One ``--json`` entry. ``lastActivity``: the head event's timestamp (epoch ms);
    ``quarantined``: why the hub refuses it (its recovery failed at the last start), if so."""

    workspace: str
    head: int
    hash: str
    last_activity: int
    quarantined: str | None = None


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="list workspaces with their heads and last activity",
        description="List every workspace: name, head seq, time of the last event (UTC).",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        heads = await store.heads()
        quarantined = await load_quarantined(store)
        if args.json:
            rows = [
                WorkspaceRow(h.workspace, h.seq, h.hash, h.timestamp, quarantined.get(h.workspace))
                for h in heads
            ]
            print(msgspec.json.encode(rows).decode())
        elif heads:
            print("\n".join(render(heads, quarantined)))
        return EXIT_OK

    return await with_store(COMMAND, args, body)


def render(heads: list[Head], quarantined: dict[str, str] | None = None) -> list[str]:
    """An aligned table: WORKSPACE, HEAD, LAST ACTIVITY, and ``QUARANTINED: why`` after a
    quarantined workspace (pure)."""
    why = quarantined or {}
    name_width = max(len("WORKSPACE"), *(len(h.workspace) for h in heads))
    seq_width = max(len("HEAD"), *(len(str(h.seq)) for h in heads))
    lines = [f"{'WORKSPACE':<{name_width}}  {'HEAD':>{seq_width}}  LAST ACTIVITY"]
    lines += [
        f"{h.workspace:<{name_width}}  {h.seq:>{seq_width}}  {format_time(h.timestamp)}"
        + (f"  QUARANTINED: {why[h.workspace]}" if h.workspace in why else "")
        for h in heads
    ]
    return lines
