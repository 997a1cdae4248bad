"""A hub node's identity and cluster timing (pure; no driver is imported here).

Every ``agora serve`` process is a *node*. Its id is what ``execStarted.payload.node`` records
and what the ``nodes`` table is keyed by. By default each process gets a fresh id
(``<host>-<pid>-<8 hex>``), so a restarted node is a new node and its predecessor is reaped
like any dead one; ``AGORA_NODE_ID`` pins it (then only one running process may use it).

Environment (read by ``agora serve``; docs/operations.md, "Running several nodes"):

| variable | default | |
|---|---|---|
| ``AGORA_NODE_ID`` | generated | 1-128 of ``[A-Za-z0-9._-]`` |
| ``AGORA_HEARTBEAT_S`` | 2 | seconds between beats (and between looks for dead nodes) |
| ``AGORA_NODE_TIMEOUT_S`` | 10 | a node whose last beat is older is dead |
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from collections.abc import Mapping
from typing import Final

import msgspec

from hub.core.errors import ConfigError

__all__ = ["NODE_ID_RE", "NodeSettings", "new_node_id"]

NODE_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
NODE_ID_ENV: Final = "AGORA_NODE_ID"
HEARTBEAT_ENV: Final = "AGORA_HEARTBEAT_S"
TIMEOUT_ENV: Final = "AGORA_NODE_TIMEOUT_S"
DEFAULT_HEARTBEAT_S: Final = 2.0
DEFAULT_TIMEOUT_S: Final = 10.0


def new_node_id() -> str:
    """A fresh id for this process: ``<host>-<pid>-<8 hex>`` (the host part sanitised)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "node"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


class NodeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """``node_id`` (None: generate one), ``heartbeat_s`` and ``timeout_s``."""

    node_id: str | None = None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.node_id is not None and not NODE_ID_RE.fullmatch(self.node_id):
            raise ConfigError(
                f"invalid node id {self.node_id!r}: use 1-128 of [A-Za-z0-9._-]",
                source=NODE_ID_ENV,
            )
        if not 0 < self.heartbeat_s < self.timeout_s:
            raise ConfigError(
                f"need 0 < {HEARTBEAT_ENV} ({self.heartbeat_s}) < {TIMEOUT_ENV} ({self.timeout_s})",
                source=HEARTBEAT_ENV,
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NodeSettings:
        """The settings from ``AGORA_NODE_ID``, ``AGORA_HEARTBEAT_S``,
        ``AGORA_NODE_TIMEOUT_S``. Raises :class:`ConfigError` naming a bad variable."""
        return cls(
            node_id=env.get(NODE_ID_ENV) or None,
            heartbeat_s=_seconds(env, HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S),
            timeout_s=_seconds(env, TIMEOUT_ENV, DEFAULT_TIMEOUT_S),
        )

    def resolved_id(self) -> str:
        return self.node_id if self.node_id is not None else new_node_id()


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{name} must be a number of seconds, not {text!r}", source=name
        ) from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds", source=name)
    return value
