"""Plumbing shared by the audit commands (``append``, ``replay``, ``state``, ``verify``,
``export``, ``import``, ``workspaces``): argument types, exit codes, error reporting, opening
the store, and writing stored bytes to stdout.

Exit codes (docs/cli.md, "Exit codes"): 0 done; 1 the command ran and failed (bad input, a
rule refused the batch, unknown workspace, a damaged log, store unavailable); 2 usage (bad
flags or arguments, bad configuration or store URL); 141 stdout closed early (``| head``);
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Final

import msgspec

from hub.commands.common import (
    add_config_arg,
    add_data_args,
    config_from_args,
    fail,
    store_from_args,
)
from hub.core.decoding import check_json_depth
from hub.core.errors import AgoraError, BadRequest, ConfigError, NotFound, Unavailable
from hub.core.events import Event, decode_event
from hub.core.records import Head
from hub.core.validation import DEFAULT_LIMITS, validate_id, validate_workspace
from hub.log.base import EventStore

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_PIPE: Final = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left

# Events per store read: big enough to amortise a round trip, small enough to stream.
PAGE: Final = 5000


# -- argument types ---------------------------------------------------------------------------


def workspace_name(text: str) -> str:
    """argparse type: a valid workspace name."""
    try:
        return validate_workspace(text)
    except BadRequest as e:
        raise argparse.ArgumentTypeError(e.message) from None


def integer_at_least(text: str, minimum: int) -> int:
    """``text`` as an integer >= ``minimum``, or the argparse error that says why not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def seq_number(text: str) -> int:
    """argparse type: a seq, an integer >= 0."""
    return integer_at_least(text, 0)


def agent_id(text: str) -> str:
    """argparse type: an agent id (1-256 bytes, no control characters)."""
    try:
        return validate_id(text, "producer")
    except BadRequest as e:
        raise argparse.ArgumentTypeError(e.message) from None


def add_workspace_arg(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    if optional:
        parser.add_argument(
            "workspace",
            nargs="?",
            type=workspace_name,
            metavar="WORKSPACE",
            help="the workspace (default: every workspace)",
        )
    else:
        parser.add_argument(
            "workspace", type=workspace_name, metavar="WORKSPACE", help="the workspace"
        )


def add_store_args(parser: argparse.ArgumentParser) -> None:
    """``--data DIR``, ``--store URL`` and ``--config FILE`` (whose ``[storage]`` and
    ``[limits]`` apply; the flags win over the file)."""
    add_data_args(parser)
    add_config_arg(parser)


# -- reporting --------------------------------------------------------------------------------


def report(command: str, error: AgoraError, code: int = EXIT_FAILED) -> int:
    """Print ``agora COMMAND: error: <code>: <message>`` on stderr; return ``code``."""
    return fail(command, f"{error.code}: {error.message}", code)


def warn(command: str, message: str) -> None:
    print(f"agora {command}: warning: {' '.join(message.split())}", file=sys.stderr)


# -- the store --------------------------------------------------------------------------------


async def with_store(
    command: str,
    args: argparse.Namespace,
    body: Callable[[EventStore], Awaitable[int]],
    *,
    read_only: bool = True,
) -> int:
    """Open the store named by ``--store``/``--data``, run ``body`` with it, close it.

    Maps failures to exit codes: bad configuration or store URL → 2; any other
    :class:`AgoraError` or a file error → 1 (printed as ``error: <code>: <message>``); stdout
    closed by its reader → 141. A ``read_only`` command refuses a data directory that does not
    exist rather than creating an empty one (a mistyped ``--data`` would look like an empty hub).
    """
    try:
        config = config_from_args(args)
        if read_only and config.storage.store is None and not config.storage.data_dir.is_dir():
            return report(
                command,
                NotFound(f"no data directory {str(config.storage.data_dir)!r} (see --data)"),
            )
        store = store_from_args(args)
    except (BadRequest, ConfigError) as e:  # ConfigError, or a malformed/unknown store URL
        return report(command, e, EXIT_USAGE)
    except OSError as e:
        return report(command, Unavailable(f"cannot open the data directory: {e}"))
    try:
        async with store:
            return await body(store)
    except AgoraError as e:
        return report(command, e)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE
    except OSError as e:  # an output or input file
        where = f" ({e.filename})" if e.filename else ""
        return report(command, Unavailable(f"{e.strerror or e}{where}"))


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


async def require_head(store: EventStore, workspace: str) -> Head:
    """The workspace's head. Raises :class:`NotFound` if it has no events."""
    head = await store.head(workspace)
    if head is None:
        raise NotFound(f"workspace {workspace!r} has no events", workspace=workspace)
    return head


# -- output -----------------------------------------------------------------------------------


def write_bytes(data: bytes) -> None:
    """Write stored (UTF-8 JSON) bytes to stdout's binary buffer, after any text already
    printed."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a plain text stream (tests): decode
        sys.stdout.write(data.decode("utf-8", "surrogateescape"))
        return
    sys.stdout.flush()
    buffer.write(data)


def progress_enabled() -> bool:
    """Progress lines go to stderr only when a person is watching it."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextlib.asynccontextmanager
async def progress(label: str, *, enabled: bool, every: float = 1.0) -> AsyncIterator[None]:
    """While the body runs, rewrite one stderr line ``LABEL… Ns`` every ``every`` seconds
    (only when ``enabled``; nothing is printed for a body that finishes sooner)."""
    if not enabled:
        yield
        return
    start = time.monotonic()
    shown = False

    async def tick() -> None:
        nonlocal shown
        while True:
            await asyncio.sleep(every)
            sys.stderr.write(f"\r\x1b[K{label}… {time.monotonic() - start:.0f}s")
            sys.stderr.flush()
            shown = True

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def read_input(path: Path | None) -> bytes:
    """The whole of ``path``, or of stdin when ``path`` is None or ``-``. Raises ``NotFound``
    or ``Unavailable`` for an unreadable file."""
    if path is None or str(path) == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is not None:
            data: bytes = buffer.read()
            return data
        return sys.stdin.read().encode("utf-8", "surrogateescape")
    try:
        return path.read_bytes()
    except FileNotFoundError as e:
        raise NotFound(f"no such file {str(path)!r}") from e
    except OSError as e:
        raise Unavailable(f"cannot read {str(path)!r}: {e.strerror or e}") from e


# -- JSON Lines input -------------------------------------------------------------------------

# Most bad lines reported for one input; the rest are counted.
MAX_REPORTED: Final = 20
_MSGSPEC_AT: Final = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def where(line: int | None, field: str | None, message: str) -> str:
    """``line N: FIELD: message``, leaving out what is unknown."""
    prefix = "" if line is None else f"line {line}: "
    return f"{prefix}{field}: {message}" if field else f"{prefix}{message}"


def locate(error: AgoraError, line: int | None = None) -> str:
    """``<code>: line N: FIELD: message`` for an error about one input line (the field from
    ``details['field']`` when the error names one)."""
    field = error.details.get("field")
    return f"{error.code}: {where(line, field if isinstance(field, str) else None, error.message)}"


def decode_error(line: int, error: msgspec.DecodeError) -> str:
    """A decode failure as ``badRequest: line N: FIELD: message``, the field from msgspec's
    error path (``... - at `$.payload.path``` → ``payload.path``)."""
    text = str(error)
    if not isinstance(error, msgspec.ValidationError):
        return f"badRequest: {where(line, None, f'invalid JSON: {text}')}"
    match = _MSGSPEC_AT.search(text)
    if match is None:
        return f"badRequest: {where(line, None, text)}"
    field = match.group("path").lstrip(".") or None
    return f"badRequest: {where(line, field, text[: match.start()])}"


def decode_lines(
    data: bytes,
    check: Callable[[Event], object] | None = None,
    *,
    max_depth: int = DEFAULT_LIMITS.max_depth,
) -> tuple[list[tuple[int, Event]], list[str]]:
    """Decode JSON Lines of events: ``([(line number, event)], [error messages])``.

    Blank lines are skipped; line numbers are 1-based and count them. Every line is decoded,
    so all bad lines are reported at once. A line whose payload nests deeper than
    ``max_depth`` is refused before it is decoded (the door's decode policy,
    :mod:`hub.core.decoding`). ``check`` may refuse a decoded event by raising an
    :class:`AgoraError`.
    """
    events: list[tuple[int, Event]] = []
    errors: list[str] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            check_json_depth(raw, max_depth + 1)  # + 1: the event around its payload
            event = decode_event(raw)
            if check is not None:
                check(event)
        except msgspec.DecodeError as e:  # ValidationError is a DecodeError
            errors.append(decode_error(number, e))
        except AgoraError as e:
            errors.append(locate(e, number))
        else:
            events.append((number, event))
    return events, errors


def report_all(command: str, errors: list[str]) -> int:
    """Print up to :data:`MAX_REPORTED` input errors, then how many more; return 1."""
    for message in errors[:MAX_REPORTED]:
        fail(command, message)
    if len(errors) > MAX_REPORTED:
        fail(command, f"... and {len(errors) - MAX_REPORTED} more bad lines")
    return EXIT_FAILED
