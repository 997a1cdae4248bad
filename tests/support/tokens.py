"""The secret every test hub is started with, and capability tokens signed with it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

import jwt

from hub.auth import TokenSigner

SECRET: Final = "agora-test-secret-0123456789-abcdefghijklmnop"
"""``AGORA_SECRET`` of the hubs the tests start (and the key of in-process signers)."""

TTL_S: Final = 3600
EXEC_RIGHTS: Final = ("read", "write", "exec")


def make_signer(secret: str = SECRET, clock: Callable[[], float] = time.time) -> TokenSigner:
    return TokenSigner(secret.encode(), clock=clock)


def mint(
    agent: str = "alice",
    workspaces: Sequence[str] = ("*",),
    rights: Sequence[str] = ("read", "write"),
    *,
    backends: Sequence[str] = (),
    ttl: int = TTL_S,
    secret: str = SECRET,
    clock: Callable[[], float] = time.time,
) -> str:
    """A capability token signed with the test secret (or ``secret``)."""
    return make_signer(secret, clock).issue(
        agent, workspaces, rights, backends=backends, ttl_seconds=ttl
    )


def mint_exec(
    agent: str = "alice",
    *,
    backends: Sequence[str] = ("*",),
    rights: Sequence[str] = EXEC_RIGHTS,
    workspaces: Sequence[str] = ("*",),
) -> str:
    """A token that may run code (the ``exec`` right) on ``backends`` (default: any)."""
    return mint(agent, workspaces, rights, backends=backends)


def crafted(**claims: Any) -> str:
    """A token signed correctly with the test secret, with ``claims`` over the usual ones:
    what an attacker who holds the secret's output, not the hub's rules, can forge (absurd
    ``iat``/``exp``, unknown rights…). The adversarial tests send it to every door."""
    now = int(time.time())
    body = {
        "sub": "forger",
        "iat": now,
        "exp": now + 3600,
        "jti": uuid.uuid4().hex,
        "workspaces": ["*"],
        "rights": ["read", "write"],
        "backends": [],
    } | claims
    return jwt.encode(body, SECRET, algorithm="HS256")
