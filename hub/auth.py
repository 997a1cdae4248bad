"""Capability tokens: who an agent is and what it may do.

A token is a JWT (RFC 7519) signed with HMAC-SHA256 under the hub's secret. Verification pins
``HS256`` (so ``alg: none`` and algorithm-substitution tokens are refused), requires ``sub``,
``iat``, ``exp`` and ``jti``, checks expiry with no leeway against an injectable clock, and then
checks every claim's type strictly; an unknown claim is refused rather than ignored, since it
could be a restriction this hub does not understand. A token's lifetime (``exp - iat``) may not
exceed the signer's ``max_ttl`` (``[auth] max_token_ttl``, default 30 days), at issue and at
use, and ``iat`` may not be more than :data:`IAT_LEEWAY_SECONDS` in the future (clock skew
between hub nodes): a correctly signed token minted with a stolen secret and a far-off ``exp``
is still refused. The claims:

==============  ==========================================================
``sub``         the agent id (1-256 bytes, no control characters)
``iat``/``exp`` issued at / expires at, integer epoch seconds
``jti``         the token id (random; for audit and revocation lists)
``workspaces``  workspace names, or ``["*"]`` for every workspace
``rights``      a subset of ``read``, ``write``, ``exec``, ``admin``
``backends``    backend instance ids the holder may select, or ``["*"]``
==============  ==========================================================

``admin`` implies every right, within the token's workspaces; it does not imply backends. A
token lists the backends its holder may run code on, and lists none unless the issuer names
them: the ``backend`` argument of ``exec`` is routing, never authorization (ARCHITECTURE.md,
"Execution model").

Pure except :func:`load_secret`/:func:`load_or_create_secret`, which read (and once create) the
secret file in the data directory.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import jwt
import msgspec

from hub.core.capability import (
    DEFAULT_MAX_TOKEN_TTL,
    MAX_TTL_SECONDS,
    Capability,
    Right,
    agent_id,
    normalize_backends,
    normalize_rights,
    normalize_workspaces,
)
from hub.core.errors import BadRequest, ConfigError, Unauthorized

ALGORITHM: Final = "HS256"
MIN_SECRET_BYTES: Final = 32
MAX_SECRET_BYTES: Final = 4096
MAX_TOKEN_BYTES: Final = 8192
IAT_LEEWAY_SECONDS: Final = 60
"""How far in the future a token's ``iat`` may be (clock skew); further is refused."""
SECRET_ENV: Final = "AGORA_SECRET"
SECRET_FILE: Final = "secret"

TokenFailure = Literal["expired", "invalid_signature", "malformed", "lifetime", "future"]


class _Claims(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The JWT payload, decoded strictly (unknown claims are refused)."""

    sub: str
    iat: int
    exp: int
    jti: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    workspaces: tuple[str, ...]
    rights: tuple[Right, ...]
    backends: tuple[str, ...]


class TokenSigner:
    """Issues and verifies capability tokens under one secret.

    ``clock`` returns epoch seconds (``time.time``); tests inject their own. ``max_ttl``: the
    longest lifetime a token may have, in seconds (``[auth] max_token_ttl``).
    """

    def __init__(
        self,
        secret: bytes,
        *,
        clock: Callable[[], float] = time.time,
        max_ttl: int = DEFAULT_MAX_TOKEN_TTL,
    ) -> None:
        """Raises :class:`ConfigError` for a secret shorter than 32 bytes or a ``max_ttl``
        outside 1 second to 366 days."""
        check_secret(secret, "secret")
        if isinstance(max_ttl, bool) or not 0 < max_ttl <= MAX_TTL_SECONDS:
            raise ConfigError(
                f"max_token_ttl must be 1-{MAX_TTL_SECONDS} seconds (366 days)",
                source="max_token_ttl",
            )
        self._secret = secret
        self._clock = clock
        self.max_ttl = max_ttl

    def relay_header(self, node: str) -> str:
        """The ``Agora-Relay`` value node ``node`` sends to the owner of a workspace
        (``[cluster] owners``): its id and an HMAC of it under the secret every node shares,
        so that only a node can make a connection that the owner serves without relaying."""
        return f"{node} {self._relay_proof(node)}"

    def relay_node(self, header: str) -> str | None:
        """The node that sent the ``Agora-Relay`` value ``header``, or None when the proof
        does not verify (a client's: it is relayed like any other)."""
        node, _, proof = header.strip().partition(" ")
        if not node or not proof:
            return None
        return node if hmac.compare_digest(proof, self._relay_proof(node)) else None

    def _relay_proof(self, node: str) -> str:
        message = b"agora.relay:" + node.encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def issue(
        self,
        agent: str,
        workspaces: Iterable[str],
        rights: Iterable[str],
        *,
        backends: Iterable[str] = (),
        ttl_seconds: int,
    ) -> str:
        """A signed token for ``agent`` valid for ``ttl_seconds`` from now.

        ``backends`` defaults to none: the holder may not run code until the issuer names the
        backends (or ``"*"``). Raises :class:`BadRequest` (``details['field']``) for an invalid
        agent id, workspace, right, backend id, an empty workspace or right list, or a ttl
        outside 1 second to :attr:`max_ttl`.
        """
        if (
            isinstance(ttl_seconds, bool)
            or not isinstance(ttl_seconds, int)
            or not 0 < ttl_seconds <= self.max_ttl
        ):
            raise BadRequest(
                f"ttl must be 1-{self.max_ttl} seconds ([auth] max_token_ttl)",
                field="ttl",
                limit=self.max_ttl,
            )
        now = int(self._clock())
        claims = _Claims(
            sub=agent_id(agent, "agent"),
            iat=now,
            exp=now + ttl_seconds,
            jti=_token_id(),
            workspaces=normalize_workspaces(workspaces),
            rights=normalize_rights(rights),
            backends=normalize_backends(backends),
        )
        return jwt.encode(msgspec.to_builtins(claims), self._secret, algorithm=ALGORITHM)

    def verify(self, token: str) -> Capability:
        """The capability ``token`` grants. Raises :class:`Unauthorized` with
        ``details['reason']`` one of ``expired``, ``invalid_signature`` (wrong secret, tampered,
        or an algorithm other than HS256, including ``none``), ``malformed`` (not a JWT, a
        missing, unknown or ill-typed claim), ``lifetime`` (``exp - iat`` over
        :attr:`max_ttl`) or ``future`` (``iat`` more than :data:`IAT_LEEWAY_SECONDS` ahead)."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_BYTES:
            raise _unauthorized("malformed", f"token must be 1-{MAX_TOKEN_BYTES} characters")
        try:
            payload = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                # Time claims are checked below against self._clock, with no leeway.
                options={
                    "require": ["sub", "iat", "exp", "jti"],
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.InvalidSignatureError as e:
            raise _unauthorized("invalid_signature", "token signature is invalid") from e
        except jwt.InvalidAlgorithmError as e:
            raise _unauthorized(
                "invalid_signature", f"token must be signed with {ALGORITHM}"
            ) from e
        except jwt.InvalidTokenError as e:
            raise _unauthorized("malformed", f"token is malformed: {e}") from e
        try:
            claims = msgspec.convert(payload, _Claims, strict=True)
            capability = Capability(
                agent=agent_id(claims.sub, "sub"),
                workspaces=normalize_workspaces(claims.workspaces),
                rights=normalize_rights(claims.rights),
                backends=normalize_backends(claims.backends),
                expires_at=claims.exp,
                issued_at=claims.iat,
                token_id=claims.jti,
            )
        except (msgspec.ValidationError, BadRequest) as e:
            raise _unauthorized("malformed", f"token claims are invalid: {e}") from e
        now = self._clock()
        if capability.issued_at > now + IAT_LEEWAY_SECONDS:
            raise _unauthorized(
                "future", f"token is issued in the future (iat {capability.issued_at})"
            )
        if capability.lifetime > self.max_ttl:
            raise _unauthorized(
                "lifetime",
                f"token lifetime {capability.lifetime}s exceeds the hub's maximum of "
                f"{self.max_ttl}s ([auth] max_token_ttl)",
            )
        if capability.expired(now):
            raise _unauthorized("expired", "token has expired")
        return capability


def check_secret(secret: bytes, source: str) -> bytes:
    """``secret`` if it is 32-4096 bytes; else raise :class:`ConfigError` naming ``source``."""
    if not isinstance(secret, bytes):
        raise ConfigError(f"{source}: the secret must be bytes", source=source)
    if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
        raise ConfigError(
            f"{source}: the secret must be {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} bytes "
            f"(it is {len(secret)} bytes)",
            source=source,
        )
    return secret


def load_secret(data_dir: Path, env: Mapping[str, str]) -> bytes:
    """The hub secret: ``AGORA_SECRET`` from ``env`` if set, else the file ``data_dir/secret``.

    The secret is the variable's UTF-8 bytes, or the file's bytes without trailing whitespace,
    so the file's content can be copied into ``AGORA_SECRET`` of other hub nodes. Raises
    :class:`ConfigError` when the secret is shorter than 32 bytes, the file is missing, is not
    a regular file, or is accessible by group or others (the message says ``chmod 600``).
    """
    if SECRET_ENV in env:
        return check_secret(env[SECRET_ENV].encode("utf-8", "surrogateescape"), SECRET_ENV)
    path = data_dir / SECRET_FILE
    try:
        # No symlinks; and never block on a FIFO planted in place of the file.
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as e:
        raise ConfigError(
            f"no secret: {path} does not exist and {SECRET_ENV} is not set", source=str(path)
        ) from e
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path}: the secret must not be a symlink", source=str(path)) from e
        raise ConfigError(f"cannot read {path}: {e.strerror or e}", source=str(path)) from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: the secret must be a regular file", source=str(path))
        if info.st_mode & 0o077:
            raise ConfigError(
                f"{path} is accessible by group or others (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); run: chmod 600 {path}",
                source=str(path),
            )
        data = os.read(fd, MAX_SECRET_BYTES + 2)
    finally:
        os.close(fd)
    return check_secret(data.rstrip(), str(path))


def load_or_create_secret(data_dir: Path, env: Mapping[str, str]) -> bytes:
    """Like :func:`load_secret`, but first creates ``data_dir/secret`` (and ``data_dir``,
    mode 0700) when ``AGORA_SECRET`` is unset and the file does not exist yet.

    The file (256 random bits as 64 hex characters, mode 0600) is written and fsynced under a
    temporary name and then hard-linked into place, which fails if the file already exists: a
    reader never sees a partial secret, and of two hubs starting at once both use the one that
    won. Raises :class:`ConfigError` as :func:`load_secret` does, or when the directory cannot
    be written.
    """
    if SECRET_ENV not in env and not (data_dir / SECRET_FILE).exists():
        try:
            _create_secret(data_dir)
        except OSError as e:
            raise ConfigError(
                f"cannot create the secret in {data_dir}: {e.strerror or e}",
                source=str(data_dir / SECRET_FILE),
            ) from e
    return load_secret(data_dir, env)


def _create_secret(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = data_dir / SECRET_FILE
    tmp = data_dir / f".{SECRET_FILE}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return  # another process created it first; use theirs
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _unauthorized(reason: TokenFailure, message: str) -> Unauthorized:
    return Unauthorized(message, reason=reason)


def _token_id() -> str:
    """A random ``jti``; never one starting with ``-``, which a shell command line
    (``agora token revoke --token-id ID``) would take for an option."""
    while (jti := secrets.token_urlsafe(16)).startswith("-"):
        pass
    return jti


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (the scheme in any
    case); None without one, or for another scheme. Every HTTP door reads tokens with it."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def asgi_bearer_token(scope: Mapping[str, Any]) -> str | None:
    """:func:`bearer_token` of an ASGI request's first ``Authorization`` header."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            return bearer_token(value.decode("latin-1"))
    return None
