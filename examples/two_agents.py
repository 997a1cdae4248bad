"""Two agents collaborate through a running Agora hub: a planner and a coder.

The planner asks for work; the coder claims it, writes ``hello.py`` and publishes it, asking for
review; the planner reads the file and asks for a change; the coder revises and publishes again;
the planner approves and, once the coder closes the item, the session is over. Every step is an
event in the workspace log, so afterwards ``agora replay WORKSPACE --data DIR`` shows it all.

Run it against a hub (see docs/tour.md)::

    agora serve --data ./agora-data &
    python examples/two_agents.py --url ws://127.0.0.1:8765 --data ./agora-data

``--data`` mints the two tokens locally with the hub's secret (``AGORA_SECRET`` or the
``secret`` file of the data directory); or pass ``--planner-token`` and ``--coder-token``
(from ``agora token issue``). Exit status: 0 when the work item was completed, 1 on an error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

# Runnable from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub.auth import TokenSigner, load_secret
from hub.client import Workspace, connect
from hub.core.errors import AgoraError

TOPIC = "greeting"
PATH = "hello.py"

FIRST_DRAFT = 'print("Hello, world!")\n'
REVISION = """import sys


def greet(name: str) -> str:
    return f"Hello, {name}!"


if __name__ == "__main__":
    print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))
"""


def say(agent: str, message: str) -> None:
    print(f"[{agent:>7}] {message}", flush=True)


async def planner(ws: Workspace, coder: str, patience: float) -> None:
    me = ws.session.agent
    request = await ws.request_work(
        TOPIC, {"task": f"write {PATH} that prints a greeting"}, consumer=coder
    )
    cid = request.correlation_id
    assert cid is not None
    say(me, f"needWork  {TOPIC!r} for {coder} (item {cid[:8]}, seq {request.seq})")

    claim = await ws.wait_for_kind(cid, "workClaimed", patience, after_seq=request.seq)
    say(me, f"sees {claim.producer} claimed the item (seq {claim.seq})")

    ask = await ws.wait_for_kind(cid, "feedbackRequested", patience, after_seq=claim.seq)
    text = await ws.read_file(PATH)
    say(me, f"review requested (seq {ask.seq}); {PATH} is {text!r}")
    feedback = await ws.provide_feedback(
        cid,
        {"verdict": "revise", "notes": "greet by name: take the name from argv"},
        consumer=coder,
        causation_id=ask.id,
    )
    say(me, f"feedbackProvided: revise (seq {feedback.seq})")

    revised = await ws.wait_for_kind(cid, "workPublished", patience, after_seq=feedback.seq)
    text = await ws.read_file(PATH)
    assert isinstance(text, str) and "greet(" in text, text
    say(me, f"revision published (seq {revised.seq}); {PATH} now defines greet()")
    approval = await ws.provide_feedback(
        cid, {"verdict": "approved"}, consumer=coder, causation_id=revised.id
    )
    say(me, f"feedbackProvided: approved (seq {approval.seq})")

    done = await ws.wait_for_kind(cid, "completed", patience, after_seq=approval.seq)
    say(me, f"item {cid[:8]} completed by {done.producer} (seq {done.seq})")


async def coder(ws: Workspace, patience: float) -> None:
    me = ws.session.agent
    work = await ws.wait_for_work(TOPIC, patience)
    cid = work.correlation_id
    assert cid is not None
    say(me, f"found work {cid[:8]} from {work.producer}: {work.payload}")
    claim = await ws.claim_work(cid, causation_id=work.id)
    say(me, f"workClaimed (seq {claim.seq})")

    state = await ws.state()
    entry = state.files.get(PATH)
    written = await ws.write_file(PATH, FIRST_DRAFT, base_rev=entry.rev if entry else 0)
    say(me, f"fileWritten {PATH} (seq {written.seq})")
    published = await ws.publish_work(
        cid, {"files": [PATH]}, consumer=work.producer, causation_id=written.id
    )
    say(me, f"workPublished (seq {published.seq})")
    ask = await ws.request_feedback(cid, {"question": "does this do it?"}, consumer=work.producer)
    say(me, f"feedbackRequested (seq {ask.seq})")

    feedback = await ws.wait_for_feedback(cid, patience, after_seq=ask.seq)
    say(me, f"got feedback: {feedback.payload}")
    rev = (await ws.state()).files[PATH].rev
    written = await ws.write_file(PATH, REVISION, base_rev=rev)
    say(me, f"fileWritten {PATH} rev {rev + 1} (seq {written.seq})")
    published = await ws.publish_work(
        cid, {"files": [PATH]}, consumer=work.producer, causation_id=feedback.id
    )
    say(me, f"workPublished the revision (seq {published.seq})")

    approval = await ws.wait_for_feedback(cid, patience, after_seq=published.seq)
    say(me, f"got feedback: {approval.payload}")
    # The hub lets only the owner of a claimed item complete it (docs/events.md, decide rules).
    done = await ws.signal_completed(cid, {"summary": f"{PATH} greets by name"})
    say(me, f"completed (seq {done.seq})")


def tokens(args: argparse.Namespace) -> tuple[str, str]:
    if args.planner_token and args.coder_token:
        return args.planner_token, args.coder_token
    if args.data is None:
        raise SystemExit("two_agents: give --data DIR, or --planner-token and --coder-token")
    signer = TokenSigner(load_secret(Path(args.data), os.environ))
    rights = ["read", "write"]
    return (
        signer.issue(args.planner, [args.workspace], rights, ttl_seconds=3600),
        signer.issue(args.coder, [args.workspace], rights, ttl_seconds=3600),
    )


async def run(args: argparse.Namespace) -> int:
    planner_token, coder_token = tokens(args)
    async with (
        connect(args.url, planner_token) as planner_session,
        connect(args.url, coder_token) as coder_session,
    ):
        say(planner_session.agent, f"connected to {planner_session.server} at {args.url}")
        say(coder_session.agent, f"connected to {coder_session.server} at {args.url}")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(coder(coder_session.workspace(args.workspace), args.timeout))
            planner_ws = planner_session.workspace(args.workspace)
            tg.create_task(planner(planner_ws, coder_session.agent, args.timeout))
    print(f"done: see it with  agora replay {args.workspace} --data {args.data or 'DIR'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the hub's WebSocket URL")
    parser.add_argument("--data", help="the hub's data directory (to mint tokens locally)")
    parser.add_argument("--planner-token", help="token of the planner (instead of --data)")
    parser.add_argument("--coder-token", help="token of the coder (instead of --data)")
    parser.add_argument("--workspace", default="tour", help="workspace (default: tour)")
    parser.add_argument("--planner", default="planner", help="planner agent id (with --data)")
    parser.add_argument("--coder", default="coder", help="coder agent id (with --data)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per wait")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (AgoraError, TimeoutError, ExceptionGroup) as e:
        for error in leaves(e):
            if isinstance(error, TimeoutError):
                print("two_agents: timed out waiting for the other agent", file=sys.stderr)
            else:
                print(f"two_agents: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


def leaves(error: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, or ``[error]``."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


if __name__ == "__main__":
    sys.exit(main())
