"""A hub node's identity. The cluster's settings are ``[cluster]`` in ``agora.toml``
(:class:`hub.config.ClusterConfig`, where every default is written; ``agora serve`` applies the
environment overrides); this module only mints the id a node runs under when none is pinned.

Every ``agora serve`` process is a *node*. Its id is what ``execRequested.payload.node`` and
``execStarted.payload.node`` record and what the ``nodes`` table is keyed by. By default each
process gets a fresh id (``<host>-<pid>-<8 hex>``), so a restarted node is a new node and its
predecessor is reaped like any dead one; ``[cluster] node_id`` (or ``AGORA_NODE_ID``) pins it
(then only one running process may use it).
"""

from __future__ import annotations

import os
import re
import secrets
import socket

from hub.config import NODE_ID_RE, ClusterConfig

__all__ = ["NODE_ID_RE", "new_node_id", "resolve_node_id"]


def new_node_id() -> str:
    """A fresh id for this process: ``<host>-<pid>-<8 hex>`` (the host part sanitised)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:64] or "node"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def resolve_node_id(cluster: ClusterConfig) -> str:
    """The pinned ``node_id``, or a fresh one."""
    return cluster.node_id if cluster.node_id is not None else new_node_id()
