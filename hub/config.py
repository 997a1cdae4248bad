"""Hub configuration: defaults, an optional TOML file, and command-line overrides.

Pure except :func:`load_config`, which reads the file. Every table and key is declared here;
a key this module does not know is an error naming the key and the file, never silently
ignored (a typo such as ``max_frame_byte`` must not leave a limit at its default). The full
reference is in docs/operations.md, "Configuration file".
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from hub.core.capability import DEFAULT_MAX_TOKEN_TTL, MAX_TTL_SECONDS
from hub.core.errors import BadRequest
from hub.core.errors import ConfigError as ConfigError  # re-exported: users catch it here
from hub.core.execution.policy import Access
from hub.core.execution.settings import RuntimeSettings
from hub.core.projections.snapshots import DEFAULT_SNAPSHOT_EVERY
from hub.core.validation import (
    DEFAULT_LIMITS,
    DEFAULT_MAX_BLOB_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_WORKSPACE_BYTES,
    EVENT_FRAME_RESERVE,
    Limits,
    validate_backend_id,
)
from hub.core.wire.session import Positive, SessionLimits

DEFAULT_DATA: Final = "./agora-data"
"""The data directory when neither ``--data`` nor ``[storage] data`` names one."""

SHUTDOWN_TIMEOUT_S: Final = 3.0
"""How long a listener that stops (the HTTP port, the A2A gRPC binding) lets requests in flight
finish before it closes them."""


def url_host(host: str) -> str:
    """``host`` (a ``[server] host`` value) as it goes in a URL: an unspecified address becomes
    the loopback one, an IPv6 address is bracketed. Here, below every door, so that the HTTP
    port and the A2A card (which may not import each other) write the one rule."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    if addr.is_unspecified:
        return "127.0.0.1" if addr.version == 4 else "[::1]"
    return f"[{host}]" if addr.version == 6 else host


NODE_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""A node id (``[cluster] node_id``, ``AGORA_NODE_ID``): what ``execStarted.payload.node``
records and the ``nodes`` table is keyed by."""


BackendKind = Literal["process", "container", "wasm", "python", "rust", "javascript"]

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]  # 0: let the OS choose (tests)
Seconds = Annotated[float, msgspec.Meta(gt=0, le=86400)]  # at most a day: a typo, not a plan
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every table: unknown keys are errors."""


class ServerConfig(_Section, frozen=True):
    """``[server]``: where the WebSocket listener and the one HTTP port (A2A, probes, metrics,
    the other HTTP doors: :mod:`hub.http`) bind. ``a2a_port`` is the old name of
    ``http_port``, still read from files (:func:`parse_config` renames it)."""

    host: NonEmpty = "127.0.0.1"
    port: Port = 8765
    http_port: Port = 8766
    # permessage-deflate costs more CPU than it saves on small event frames; opt in for
    # large-payload workloads over slow links.
    compression: Literal["deflate"] | None = None
    # A subscriber that reconnects within this many seconds keeps its presence: no
    # memberLeft/memberJoined pair per reconnect (0: record every leave at once).
    presence_grace_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 5.0
    # Worker processes of `agora serve` (docs/operations.md, "Workers"): 1 is one process, as
    # before; N > 1 is a supervisor and N workers on the same port, each owning a share of the
    # workspaces (hub.core.sharding).
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # With workers: how often each worker looks whether another process committed to the
    # SQLite file (PRAGMA data_version), so its subscribers hear of writes made elsewhere.
    worker_poll_s: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.02

    @property
    def a2a_port(self) -> int:
        """The old name of :attr:`http_port` (A2A is served on the HTTP port)."""
        return self.http_port


class LimitsConfig(SessionLimits, _Section, frozen=True):
    """``[limits]``: per-connection and per-event bounds. See docs/operations.md for what
    happens at each limit. The per-connection ones the protocol session enforces (batch size,
    publish rate and burst, subscriptions, bad frames, execution waits) are inherited from
    :class:`hub.core.wire.session.SessionLimits` with their defaults: this *is* the session's
    limits, passed to every session as it is."""

    max_frame_bytes: Positive = DEFAULT_MAX_FRAME_BYTES
    send_queue: Positive = 4096  # frames queued per connection before close 4408
    # Bytes queued per connection (events and replies) before close 4408: memory per
    # connection is bounded in bytes, not only in frames (a frame may be max_frame_bytes).
    send_queue_bytes: Positive = 8 * 1024 * 1024
    max_connections: Positive = 1024  # open WebSocket connections; over it: HTTP 503
    max_connections_per_agent: Positive = 64  # authenticated; over it: error busy, close 1013
    hello_timeout_s: Seconds = 10.0  # to authenticate after the handshake; then close 4401
    # Inline file content one `state` reply with "contents": true may carry (tooLarge over it).
    max_state_contents_bytes: Positive = 4 * 1024 * 1024
    max_file_bytes: Positive = DEFAULT_LIMITS.max_file_bytes
    blob_threshold: Positive = DEFAULT_LIMITS.blob_threshold
    # One blob's size (putBlob over it: tooLarge) and a workspace's quota: the bytes of its
    # files and artifacts together (a putBlob or publish that would pass it: tooLarge).
    max_blob_bytes: Positive = DEFAULT_MAX_BLOB_BYTES
    max_workspace_bytes: Positive = DEFAULT_MAX_WORKSPACE_BYTES
    snapshot_every: Positive = DEFAULT_SNAPSHOT_EVERY  # events between projection snapshots

    def draft_limits(self) -> Limits:
        """The :class:`hub.core.validation.Limits` these settings imply for event drafts."""
        return Limits(
            max_file_bytes=self.max_file_bytes,
            max_event_bytes=max(1024, self.max_frame_bytes - EVENT_FRAME_RESERVE),
            blob_threshold=self.blob_threshold,
            max_depth=self.max_depth,
            max_workspace_bytes=self.max_workspace_bytes,
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


class ClusterConfig(_Section, frozen=True):
    """``[cluster]``: this node's id and the cluster's timing, used when the store is shared
    (PostgreSQL; docs/operations.md, "Running several nodes"). ``agora serve`` lets the
    environment override each key (``AGORA_NODE_ID``, ``AGORA_HEARTBEAT_S``,
    ``AGORA_NODE_TIMEOUT_S``, ``AGORA_CLUSTER_OWNERS``, ``AGORA_NODE_URL``)."""

    # None: a fresh ``<host>-<pid>-<8 hex>`` per process, so a restarted node is a new node
    # and its predecessor is reaped like any dead one. Pinned, one running process may use it.
    node_id: str | None = None
    heartbeat_s: Seconds = 2.0  # between beats, and between looks for dead nodes
    timeout_s: Seconds = 10.0  # a node whose last beat is older is dead
    # One node decides each workspace: the others relay its frames there (docs/operations.md,
    # "Owners: one node decides a workspace"). Off: every node decides what it receives.
    owners: bool = False
    # Where the other nodes reach this one (ws:// or wss://); None: the URL it serves on,
    # which a wildcard host cannot be (then required with owners).
    url: Annotated[str, msgspec.Meta(pattern=r"^wss?://[^\s/]+/?$", max_length=512)] | None = None


class AuthConfig(_Section, frozen=True):
    """``[auth]``: capability token rules (docs/operations.md, "Tokens")."""

    # Seconds; the longest lifetime (exp - iat) a token may have, enforced when `agora token
    # issue` signs one and whenever the hub verifies one. At most 366 days.
    max_token_ttl: Annotated[int, msgspec.Meta(ge=1, le=MAX_TTL_SECONDS)] = DEFAULT_MAX_TOKEN_TTL


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


class PushSettings(_Section, frozen=True):
    """``[a2a.push]``: A2A push notifications (docs/a2a.md, "Push notifications"). Webhook
    URLs come from clients, so only what the operator allows is called: globally routable
    addresses (``allow_public``), the networks in ``allowed_networks`` (CIDRs, e.g.
    ``"10.1.0.0/16"``), and loopback only with ``allow_loopback`` (tests)."""

    enabled: bool = True
    allow_public: bool = True
    allow_loopback: bool = False
    allowed_networks: tuple[str, ...] = ()
    max_configs_per_task: Annotated[int, msgspec.Meta(ge=1, le=100)] = 8
    max_configs: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10_000
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=20)] = 4
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    backoff_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.5  # doubles after each attempt


class A2AConfig(_Section, frozen=True):
    """``[a2a]``. ``grpc_port``: serve the A2A gRPC binding there too (0: a free port;
    absent: no gRPC)."""

    peers: tuple[PeerConfig, ...] = ()
    push: PushSettings = msgspec.field(default_factory=PushSettings)
    grpc_port: Port | None = None


class McpConfig(_Section, frozen=True):
    """``[mcp]``: the MCP door at ``/mcp`` of the HTTP port (docs/mcp.md)."""

    max_sessions: Positive = 256  # MCP sessions open at once (each holds a hub connection)
    # Sessions one agent may hold (all its tokens together); one more ends its oldest.
    max_sessions_per_agent: Positive = 8
    session_idle_s: Seconds = 1800.0  # a session with no request or stream this long is closed
    # code_exec's language (rust, python, wasm, shell) -> backend instance id, over the
    # defaults (the instance named after the kind; shell: process).
    backends: dict[Literal["rust", "python", "wasm", "shell"], str] = msgspec.field(
        default_factory=dict
    )


class ViewerConfig(_Section, frozen=True):
    """``[viewer]``: the viewer's JSON endpoints under ``/ui/api`` (docs/viewer.md)."""

    exports_per_agent: Positive = 2  # exports one agent runs at once; one more: 429
    # An export's whole response, however slowly the client reads; then the download is cut.
    export_deadline_s: Seconds = 600.0


class HubConfig(_Section, frozen=True):
    """The whole configuration; every field has a default, so ``HubConfig()`` is valid."""

    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    storage: StorageConfig = msgspec.field(default_factory=StorageConfig)
    backends: tuple[BackendConfig, ...] = ()
    a2a: A2AConfig = msgspec.field(default_factory=A2AConfig)
    # [runtime] (and [runtime.sync], [runtime.rust]): one type, the runtime's own settings.
    runtime: RuntimeSettings = msgspec.field(default_factory=RuntimeSettings)
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    viewer: ViewerConfig = msgspec.field(default_factory=ViewerConfig)

    def with_overrides(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        http_port: int | None = None,
        workers: int | None = None,
        data: str | Path | None = None,
        store: str | None = None,
        node_id: str | None = None,
        heartbeat_s: float | None = None,
        timeout_s: float | None = None,
        owners: bool | None = None,
        url: str | None = None,
        source: str = "command line",
    ) -> HubConfig:
        """A copy with each given (non-``None``) value replacing the file's; command-line flags
        and environment overrides win over the file. Raises :class:`ConfigError` naming
        ``source`` for an out-of-range value."""
        server = self.server
        storage = self.storage
        cluster = self.cluster
        if host is not None or port is not None or http_port is not None or workers is not None:
            server = msgspec.structs.replace(
                server,
                host=server.host if host is None else host,
                port=server.port if port is None else port,
                http_port=server.http_port if http_port is None else http_port,
                workers=server.workers if workers is None else workers,
            )
        if data is not None or store is not None:
            storage = msgspec.structs.replace(
                storage,
                data=storage.data if data is None else str(data),
                store=storage.store if store is None else store,
            )
        given = {
            "node_id": node_id,
            "heartbeat_s": heartbeat_s,
            "timeout_s": timeout_s,
            "owners": owners,
            "url": url,
        }
        if any(value is not None for value in given.values()):
            cluster = msgspec.structs.replace(
                cluster, **{key: value for key, value in given.items() if value is not None}
            )
        replaced = msgspec.structs.replace(self, server=server, storage=storage, cluster=cluster)
        # Re-validate: replace() does not check Meta constraints.
        return parse_config(msgspec.to_builtins(replaced), source=source)


def parse_config(raw: object, source: str = "<config>") -> HubConfig:
    """Validate a decoded TOML document. Raises :class:`ConfigError` naming ``source`` and the
    offending key (unknown key, wrong type, out of range, duplicate backend id or peer name,
    both ``server.http_port`` and its old name ``server.a2a_port``)."""
    raw = _renamed_keys(raw, source)
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
    for i, net in enumerate(config.a2a.push.allowed_networks):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError as e:
            raise ConfigError(
                f"{source}: a2a.push.allowed_networks[{i}]: {net!r} is not a network (CIDR)",
                source=source,
            ) from e
    cluster = config.cluster
    if cluster.node_id is not None and not NODE_ID_RE.fullmatch(cluster.node_id):
        raise ConfigError(
            f"{source}: invalid node id {cluster.node_id!r} at cluster.node_id: "
            "use 1-128 of [A-Za-z0-9._-]",
            source=source,
        )
    if not cluster.heartbeat_s < cluster.timeout_s:
        raise ConfigError(
            f"{source}: cluster.heartbeat_s ({cluster.heartbeat_s:g}) must be less than "
            f"cluster.timeout_s ({cluster.timeout_s:g})",
            source=source,
        )
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


def _renamed_keys(raw: object, source: str) -> object:
    """``raw`` with ``[server] a2a_port`` (the HTTP port's name before it served more than A2A)
    read as ``http_port``; both given is an error, not a silent choice."""
    if not isinstance(raw, dict):
        return raw
    server = raw.get("server")
    if not isinstance(server, dict) or "a2a_port" not in server:
        return raw
    if "http_port" in server:
        raise ConfigError(
            f"{source}: server.a2a_port is the old name of server.http_port: give one",
            source=source,
        )
    renamed = {("http_port" if k == "a2a_port" else k): v for k, v in server.items()}
    return {**raw, "server": renamed}


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
