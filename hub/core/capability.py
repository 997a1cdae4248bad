"""The capability a verified token grants: who an agent is and what it may do.

Pure: the type, its checks and the normalisers of token claims. Signing and verifying tokens
(JWT, the secret file) is :mod:`hub.auth`'s job, above the core.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, Literal, get_args

import msgspec

from hub.core.errors import BadRequest, Forbidden
from hub.core.events import TokenRevokedPayload
from hub.core.validation import validate_backend_id, validate_id, validate_workspace

Right = Literal["read", "write", "exec", "admin"]
RIGHTS: Final[tuple[Right, ...]] = get_args(Right)
"""Every right, in canonical order (the order tokens and ``welcome`` frames list them)."""

ANY: Final = "*"
"""Wildcard for ``workspaces`` and ``backends``."""

MAX_TTL_SECONDS: Final = 366 * 86400
"""The ceiling of ``[auth] max_token_ttl``: no configuration allows longer-lived tokens."""
DEFAULT_MAX_TOKEN_TTL: Final = 30 * 86400
"""``[auth] max_token_ttl``'s default: the longest lifetime (``exp - iat``) a token may have."""

SYSTEM_WORKSPACE: Final = "_agora"
"""The hub's system workspace: its own records (``tokenRevoked``), written only by the hub and
``agora token revoke``. ``"*"`` does not cover it; no client may publish there."""


class Capability(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a verified token allows. Build it with :meth:`TokenSigner.verify`.

    JSON (camelCase): ``agent, workspaces, rights, backends, expiresAt, issuedAt, tokenId``.
    """

    agent: str
    workspaces: tuple[str, ...]
    rights: tuple[Right, ...]
    backends: tuple[str, ...] = ()
    expires_at: int
    issued_at: int
    token_id: str

    def allows_workspace(self, workspace: str) -> bool:
        """Whether the token names ``workspace`` (or every workspace but the system one)."""
        if workspace in self.workspaces:
            return True
        return ANY in self.workspaces and workspace != SYSTEM_WORKSPACE

    def has(self, right: Right, workspace: str) -> bool:
        """Whether the holder has ``right`` in ``workspace``; ``admin`` implies every right."""
        return self.allows_workspace(workspace) and (right in self.rights or "admin" in self.rights)

    def allows_backend(self, backend: str) -> bool:
        """Whether the holder may select the backend instance ``backend``."""
        return ANY in self.backends or backend in self.backends

    def expired(self, now: float) -> bool:
        """Whether the token has expired at epoch seconds ``now`` (for long-lived sessions)."""
        return now >= self.expires_at

    @property
    def lifetime(self) -> int:
        """Seconds from issue to expiry (``exp - iat``)."""
        return self.expires_at - self.issued_at

    def require(self, right: Right, workspace: str) -> None:
        """Raise :class:`Forbidden` (details ``right``, ``workspace``) unless :meth:`has`."""
        if not self.has(right, workspace):
            if self.allows_workspace(workspace):
                message = f"agent {self.agent!r} lacks the {right!r} right in {workspace!r}"
            else:
                message = f"agent {self.agent!r} has no access to workspace {workspace!r}"
            raise Forbidden(message, right=right, workspace=workspace)

    def require_backend(self, backend: str) -> None:
        """Raise :class:`Forbidden` (details ``backend``) unless :meth:`allows_backend`."""
        if not self.allows_backend(backend):
            raise Forbidden(
                f"agent {self.agent!r} may not select backend {backend!r}", backend=backend
            )


class RevocationList:
    """The tokens revoked so far: token ids, and per agent the latest ``before`` (a token of
    that agent issued at or before it is revoked). Built from ``tokenRevoked`` payloads in log
    order; adding is idempotent, so replaying the system workspace twice changes nothing."""

    def __init__(self) -> None:
        self._token_ids: set[str] = set()
        self._agents: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._token_ids) + len(self._agents)

    def add(self, revocation: TokenRevokedPayload, at: int) -> None:
        """Record ``revocation``; ``at`` (epoch seconds: the event's time) stands for a missing
        ``before`` of an agent revocation."""
        if revocation.token_id is not None:
            self._token_ids.add(revocation.token_id)
        if revocation.agent is not None:
            before = revocation.before if revocation.before is not None else at
            self._agents[revocation.agent] = max(before, self._agents.get(revocation.agent, before))

    def revokes(self, capability: Capability) -> bool:
        """Whether the token ``capability`` came from is revoked."""
        if capability.token_id in self._token_ids:
            return True
        before = self._agents.get(capability.agent)
        return before is not None and capability.issued_at <= before


def normalize_workspaces(workspaces: Iterable[str]) -> tuple[str, ...]:
    """Validated, de-duplicated workspace names in order, or ``("*",)`` if ``"*"`` is among
    them. Raises :class:`BadRequest` (field ``workspaces``) for an invalid name or none."""
    names = _names(workspaces, "workspaces", lambda w: validate_workspace(w, "workspaces"))
    if not names:
        raise BadRequest("at least one workspace (or '*') is required", field="workspaces")
    return names


def normalize_backends(backends: Iterable[str]) -> tuple[str, ...]:
    """Validated, de-duplicated backend ids in order, ``("*",)``, or ``()`` for none. Raises
    :class:`BadRequest` (field ``backends``) for an invalid id."""
    return _names(backends, "backends", lambda b: validate_backend_id(b, "backends"))


def normalize_rights(rights: Iterable[str]) -> tuple[Right, ...]:
    """The rights as a tuple in canonical order. Raises :class:`BadRequest` (field ``rights``)
    for an unknown right or an empty list."""
    given = _strings(rights, "rights")
    unknown = [r for r in given if r not in RIGHTS]
    if unknown:
        raise BadRequest(f"unknown right {unknown[0]!r}: use {', '.join(RIGHTS)}", field="rights")
    if not given:
        raise BadRequest(f"at least one right is required: {', '.join(RIGHTS)}", field="rights")
    return tuple(r for r in RIGHTS if r in given)


def _strings(values: Iterable[str], field: str) -> list[str]:
    if isinstance(values, str | bytes):
        raise BadRequest(f"{field} must be a list of strings, not one string", field=field)
    items = list(values)
    for item in items:
        if not isinstance(item, str):
            raise BadRequest(f"{field} must be a list of strings", field=field)
    return items


def _names(values: Iterable[str], field: str, validate: Callable[[str], str]) -> tuple[str, ...]:
    items = _strings(values, field)
    if ANY in items:
        return (ANY,)
    return tuple(dict.fromkeys(validate(item) for item in items))


def agent_id(agent: str, field: str) -> str:
    """``agent`` validated as an agent id, or raise :class:`BadRequest` naming ``field``."""
    if not isinstance(agent, str):
        raise BadRequest(f"{field} must be a string", field=field)
    return validate_id(agent, field)
