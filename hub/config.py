"""Hub configuration: defaults, an optional TOML file, and command-line overrides.

Pure except :func:`load_config`, which reads the file. Every table and key is declared here;
a key this module does not know is an error naming the key and the file, never silently
ignored (a typo such as ``max_frame_byte`` must not leave a limit at its default). The full
reference is in docs/operations.md, "Configuration file".
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from hub.core.errors import BadRequest
from hub.core.errors import ConfigError as ConfigError  # re-exported: users catch it here
from hub.core.validation import DEFAULT_LIMITS, Limits, validate_backend_id

DEFAULT_DATA: Final = "./agora-data"
"""The data directory when neither ``--data`` nor ``[storage] data`` names one."""


BackendKind = Literal["process", "container", "wasm", "python", "rust"]
Access = Literal["read", "read-write"]

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]  # 0: let the OS choose (tests)
Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveRate = Annotated[float, msgspec.Meta(gt=0)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every table: unknown keys are errors."""


class ServerConfig(_Section, frozen=True):
    """``[server]``: where the WebSocket and A2A listeners bind."""

    host: NonEmpty = "127.0.0.1"
    port: Port = 8765
    a2a_port: Port = 8766
    # permessage-deflate costs more CPU than it saves on small event frames; opt in for
    # large-payload workloads over slow links.
    compression: Literal["deflate"] | None = None


class LimitsConfig(_Section, frozen=True):
    """``[limits]``: per-connection and per-event bounds. See docs/operations.md for what
    happens at each limit."""

    max_frame_bytes: Positive = 1024 * 1024
    max_batch_events: Positive = 256
    publish_rate: PositiveRate = 2000.0  # events per second per connection (token bucket)
    publish_burst: Positive = 4000  # bucket size
    send_queue: Positive = 4096  # frames queued per connection before close 4408
    max_subscriptions: Positive = 64  # per connection
    garbage_limit: Positive = 20  # bad frames before close 1008
    max_file_bytes: Positive = DEFAULT_LIMITS.max_file_bytes
    blob_threshold: Positive = DEFAULT_LIMITS.blob_threshold
    snapshot_every: Positive = 1000  # events between projection snapshots

    def draft_limits(self) -> Limits:
        """The :class:`hub.core.validation.Limits` these settings imply for event drafts."""
        return Limits(
            max_file_bytes=self.max_file_bytes,
            max_event_bytes=self.max_frame_bytes,
            blob_threshold=self.blob_threshold,
        )


class StorageConfig(_Section, frozen=True):
    """``[storage]``: the data directory and an optional store URL (default: SQLite in it)."""

    data: NonEmpty = DEFAULT_DATA
    store: NonEmpty | None = None

    @property
    def data_dir(self) -> Path:
        return Path(self.data)


class BackendConfig(_Section, frozen=True):
    """``[[backends]]``: one named execution backend instance. ``access`` defaults to the
    safer ``read``; ``limits`` is passed to the backend, which validates its own keys."""

    id: str
    kind: BackendKind
    access: Access = "read"
    limits: dict[str, int | float | str | bool] = msgspec.field(default_factory=dict)


class PeerConfig(_Section, frozen=True):
    """``[[a2a.peers]]``: an external A2A agent this hub talks to."""

    name: NonEmpty
    card_url: NonEmpty
    token: str | None = None


class RuntimeConfig(_Section, frozen=True):
    """``[runtime]``: the execution runtime's bounds (seed 003's defaults)."""

    max_executions: Positive = 24  # running at once per hub; more → busy
    max_readers: Positive = 8  # live getExec readers per execution; more → busy
    retention_keep: Positive = 100  # finished executions always kept per workspace
    retention_window_s: Positive = 3600  # older finished ones beyond the newest N are disposed


class AuditConfig(_Section, frozen=True):
    """``[audit]``: signed checkpoints of each workspace's Merkle tree (docs/audit.md).

    A checkpoint is produced once ``checkpoint_every_events`` events were appended since the
    last one, or ``checkpoint_every_ms`` after the first event not yet covered, whichever
    comes first (never for a tree already signed), and on demand (``agora checkpoint``).
    ``hub_id`` names the hub in the key and origins (``agora.<hub id>/<workspace>``) when
    the key is first created; default: random."""

    checkpoint_every_events: Positive = 1000
    checkpoint_every_ms: Positive = 10_000
    hub_id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = None


class A2AConfig(_Section, frozen=True):
    """``[a2a]``."""

    peers: tuple[PeerConfig, ...] = ()


class HubConfig(_Section, frozen=True):
    """The whole configuration; every field has a default, so ``HubConfig()`` is valid."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    backends: tuple[BackendConfig, ...] = ()
    a2a: A2AConfig = msgspec.field(default_factory=A2AConfig)
    runtime: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)

    def with_overrides(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        a2a_port: int | None = None,
        data: str | Path | None = None,
        store: str | None = None,
    ) -> HubConfig:
        """A copy with each given (non-``None``) value replacing the file's; command-line flags
        win over the file. Raises :class:`ConfigError` for an out-of-range value."""
        server = self.server
        storage = self.storage
        if host is not None or port is not None or a2a_port is not None:
            server = msgspec.structs.replace(
                server,
                host=server.host if host is None else host,
                port=server.port if port is None else port,
                a2a_port=server.a2a_port if a2a_port is None else a2a_port,
            )
        if data is not None or store is not None:
            storage = msgspec.structs.replace(
                storage,
                data=storage.data if data is None else str(data),
                store=storage.store if store is None else store,
            )
        # Re-validate: replace() does not check Meta constraints.
        return parse_config(
            msgspec.to_builtins(msgspec.structs.replace(self, server=server, storage=storage)),
            source="command line",
        )


def parse_config(raw: object, source: str = "<config>") -> HubConfig:
    """Validate a decoded TOML document. Raises :class:`ConfigError` naming ``source`` and the
    offending key (unknown key, wrong type, out of range, duplicate backend id or peer name)."""
    try:
        config = msgspec.convert(raw, HubConfig, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{source}: {_toml_path(str(e))}", source=source) from e
    seen: set[str] = set()
    for i, backend in enumerate(config.backends):
        try:
            validate_backend_id(backend.id, f"backends[{i}].id")
        except BadRequest as e:
            raise ConfigError(f"{source}: {e.message} at backends[{i}].id", source=source) from e
        if backend.id in seen:
            raise ConfigError(
                f"{source}: duplicate backend id {backend.id!r} at backends[{i}].id", source=source
            )
        seen.add(backend.id)
    names: set[str] = set()
    for i, peer in enumerate(config.a2a.peers):
        if not peer.card_url.startswith(("https://", "http://")):
            raise ConfigError(
                f"{source}: a2a.peers[{i}].card_url must be an http(s) URL", source=source
            )
        if peer.name in names:
            raise ConfigError(
                f"{source}: duplicate peer name {peer.name!r} at a2a.peers[{i}].name",
                source=source,
            )
        names.add(peer.name)
    return config


def load_config(path: Path | None) -> HubConfig:
    """The configuration in the TOML file at ``path``, or the defaults when ``path`` is
    ``None``. Raises :class:`ConfigError` when the file is missing, unreadable, not TOML, or
    not a valid configuration (the message names the file and the key)."""
    if path is None:
        return HubConfig()
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise ConfigError(
            f"cannot read config file {path}: {e.strerror or e}", source=str(path)
        ) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}", source=str(path)) from e
    return parse_config(raw, source=str(path))


_MSGSPEC_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _toml_path(message: str) -> str:
    """Rewrite msgspec's ``Object contains unknown field `x` - at `$.server``` as
    ``unknown key `x` in server`` (TOML words; no ``at`` suffix means the top level)."""
    match = _MSGSPEC_AT.search(message)
    where = (match.group("path").lstrip(".") if match else "") or "top level"
    if match is not None:
        message = message[: match.start()]
    message = message.replace("Object contains unknown field", "unknown key")
    return f"{message} in {where}"
