"""Argument helpers shared by every ``agora`` subcommand.

Flags left out on the command line stay ``None`` here, so that :func:`config_from_args` can
tell "not given" from "given the default": precedence is flag, then config file, then built-in
default.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hub.config import DEFAULT_DATA, HubConfig, load_config
from hub.core.errors import AgoraError

if TYPE_CHECKING:
    from hub.log.base import EventStore


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--data DIR`` and ``--store URL``."""
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help=f"data directory: SQLite log, blobs, secret (default: {DEFAULT_DATA})",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="event store URL, e.g. postgresql://… (default: SQLite in the data directory)",
    )


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` (a TOML file; see docs/operations.md)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        default=None,
        help="TOML configuration file (default: built-in defaults)",
    )


def config_from_args(args: argparse.Namespace) -> HubConfig:
    """The configuration: ``--config`` (if the command has it) overridden by ``--data``,
    ``--store``, ``--host``, ``--port`` and ``--http-port`` (alias ``--a2a-port``) where
    given. Raises :class:`hub.config.ConfigError`."""
    config = load_config(getattr(args, "config", None))
    return config.with_overrides(
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        http_port=getattr(args, "http_port", None),
        data=getattr(args, "data", None),
        store=getattr(args, "store", None),
    )


def data_dir_from_args(args: argparse.Namespace) -> Path:
    """The data directory (``--data``, else the config file's, else ``./agora-data``).
    Raises :class:`hub.config.ConfigError`."""
    return config_from_args(args).storage.data_dir


def store_from_args(args: argparse.Namespace) -> EventStore:
    """An unopened event store for the resolved ``--store``/``--data``; use it as
    ``async with store_from_args(args) as store:``. Raises :class:`hub.config.ConfigError`,
    what :func:`hub.log.factory.open_store` raises (:class:`hub.core.errors.BadRequest` for a bad
    URL, :class:`OSError` when the data directory cannot be created)."""
    # Imported here: the store pulls in its drivers, which commands like `token` never need.
    from hub.log.factory import open_store

    config = config_from_args(args)
    return open_store(config.storage.store, config.storage.data_dir)


def fail(command: str, error: AgoraError | str, code: int = 2) -> int:
    """Print ``agora COMMAND: error: MESSAGE`` as one line on stderr; return ``code``."""
    message = error.message if isinstance(error, AgoraError) else error
    print(f"agora {command}: error: {' '.join(message.split())}", file=sys.stderr)
    return code
