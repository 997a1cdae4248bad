"""Sandbox policies: what an execution may touch, with presets and :func:`narrow`. Pure.

A :class:`SandboxPolicy` is adk-code's model (network, filesystem, environment, timeout, output
caps, working directory) plus resource limits (memory, pids, cpu). It is a frozen msgspec
Struct with camelCase JSON, so the same value is configured by the operator, sent on the wire
(``exec {policy}``) and recorded in ``execRequested``.

Authority (ARCHITECTURE.md "Execution model"): a backend *instance* is configured with a default
policy, the widest it will run. A request's policy may only **narrow** it (:func:`narrow`):
network on only if the instance allows it, smaller limits, fewer paths, fewer environment
variables. Anything wider is refused with :class:`hub.core.execution.errors.Rejected`; nothing is
silently clamped.

Workspace paths in a policy (``root``, ``readOnly``, ``readWrite``, ``workingDirectory``) are
relative POSIX paths inside the workspace directory the runtime prepares (``"."`` = the whole
workspace); they never name host paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec
from msgspec.structs import force_setattr

from hub.core.execution.errors import InvalidRequest, Rejected

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "EnvironmentPolicy",
    "FilesystemMode",
    "FilesystemPolicy",
    "NetworkPolicy",
    "PolicyPatch",
    "SandboxPolicy",
    "fs_within",
    "host_local",
    "narrow",
    "normalise_workspace_path",
    "strict",
    "strict_js",
    "strict_python",
]

MIB: Final = 1024 * 1024
DEFAULT_TIMEOUT_MS: Final = 30_000
DEFAULT_MAX_OUTPUT_BYTES: Final = MIB
MAX_TIMEOUT_MS: Final = 24 * 3600 * 1000
MAX_PATH_BYTES: Final = 1024

NetworkPolicy = Literal["disabled", "enabled"]
"""``disabled``: no network at all (not even loopback of the host); ``enabled``: the host's or
the engine's network."""

FilesystemMode = Literal["none", "workspaceReadOnly", "workspaceReadWrite", "paths", "host"]

_FS_MODES: Final[frozenset[str]] = frozenset(
    {"none", "workspaceReadOnly", "workspaceReadWrite", "paths", "host"}
)

Access = Literal["read", "read-write"]
"""A backend instance's access to the workspace (the operator sets it in agora.toml): a
``read`` instance never writes back, whatever a program does."""


def normalise_workspace_path(path: str, field: str) -> str:
    """``path`` as a normalised relative POSIX path inside the workspace (``"."`` = the root).

    Accepts ``""``, ``"."``, ``"./a//b/"``; refuses absolute paths, ``..``, NUL, and paths over
    1024 bytes. Raises :class:`InvalidRequest` (``details['field']``).
    """
    if not isinstance(path, str):
        raise InvalidRequest(f"{field} must be a string", field=field)
    if "\x00" in path:
        raise InvalidRequest(f"{field} must not contain NUL", field=field)
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidRequest(f"{field} is longer than {MAX_PATH_BYTES} bytes", field=field)
    if path.startswith("/"):
        raise InvalidRequest(
            f"{field} {path!r} must be relative to the workspace, not absolute", field=field
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"{field} {path!r} must not contain '..'", field=field)
    return "/".join(parts) or "."


def _path_within(path: str, root: str) -> bool:
    """Whether normalised workspace path ``path`` is ``root`` or below it."""
    return root == "." or path == root or path.startswith(root + "/")


class FilesystemPolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What part of the filesystem the program sees.

    ``mode``:

    * ``none`` — no workspace at all (the program gets only a private scratch directory).
    * ``workspaceReadOnly`` / ``workspaceReadWrite`` — the workspace subtree ``root`` (``"."``
      = all of it), read-only or read-write.
    * ``paths`` — only the listed workspace paths, ``readOnly`` ones and ``readWrite`` ones.
    * ``host`` — no restriction: the program sees the host filesystem as the hub's user does.
      Only host-local backends (``process``) offer it; it is the one mode that restricts
      nothing, so it is the only one a backend that cannot enforce filesystem policy accepts.

    Build one with the class methods; an invalid combination raises :class:`InvalidRequest`.
    """

    mode: FilesystemMode = "none"
    root: str = "."
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in _FS_MODES:
            raise InvalidRequest(f"unknown filesystem mode {self.mode!r}", field="filesystem")
        root = normalise_workspace_path(self.root, "filesystem.root")
        ro = tuple(normalise_workspace_path(p, "filesystem.readOnly") for p in self.read_only)
        rw = tuple(normalise_workspace_path(p, "filesystem.readWrite") for p in self.read_write)
        if self.mode != "paths" and (ro or rw):
            raise InvalidRequest(
                "filesystem readOnly/readWrite lists are only for mode 'paths'",
                field="filesystem",
            )
        if self.mode in ("none", "paths", "host") and root != ".":
            raise InvalidRequest(
                f"filesystem root is only for the workspace modes, not {self.mode!r}",
                field="filesystem.root",
            )
        # Normalised in place: the one sanctioned way to set a field of a frozen Struct.
        force_setattr(self, "root", root)
        force_setattr(self, "read_only", tuple(sorted(set(ro))))
        force_setattr(self, "read_write", tuple(sorted(set(rw))))

    @classmethod
    def none(cls) -> FilesystemPolicy:
        return cls(mode="none")

    @classmethod
    def workspace_read_only(cls, root: str = ".") -> FilesystemPolicy:
        return cls(mode="workspaceReadOnly", root=root)

    @classmethod
    def workspace_read_write(cls, root: str = ".") -> FilesystemPolicy:
        return cls(mode="workspaceReadWrite", root=root)

    @classmethod
    def paths(
        cls, read_only: Iterable[str] = (), read_write: Iterable[str] = ()
    ) -> FilesystemPolicy:
        return cls(mode="paths", read_only=tuple(read_only), read_write=tuple(read_write))

    @classmethod
    def host(cls) -> FilesystemPolicy:
        return cls(mode="host")

    @property
    def restricted(self) -> bool:
        """Every mode but ``host`` restricts what the program sees (and must be enforced)."""
        return self.mode != "host"

    @property
    def mounts_workspace(self) -> bool:
        return self.mode in ("workspaceReadOnly", "workspaceReadWrite", "paths")


class EnvironmentPolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Which environment variables a request may set (with explicit values).

    ``none``: none. ``allowList``: only the names in ``allow``. The hub's own environment is
    never passed to a program, whatever the policy: variables always carry the request's
    explicit values, and backends add only a minimal ``PATH``/``HOME``/``LANG``.
    """

    mode: Literal["none", "allowList"] = "none"
    allow: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("none", "allowList"):
            raise InvalidRequest(f"unknown environment mode {self.mode!r}", field="environment")
        if self.mode == "none" and self.allow:
            raise InvalidRequest(
                "environment allow list given with mode 'none'", field="environment.allow"
            )
        for name in self.allow:
            validate_env_name(name, "environment.allow")
        force_setattr(self, "allow", tuple(sorted(set(self.allow))))

    @classmethod
    def none(cls) -> EnvironmentPolicy:
        return cls()

    @classmethod
    def allow_list(cls, names: Iterable[str]) -> EnvironmentPolicy:
        return cls(mode="allowList", allow=tuple(names))

    def allows(self, name: str) -> bool:
        return self.mode == "allowList" and name in self.allow


def validate_env_name(name: str, field: str) -> str:
    """A variable name: non-empty, no ``=``, no NUL, at most 256 bytes. Raises
    :class:`InvalidRequest`."""
    if (
        not isinstance(name, str)
        or not name
        or "=" in name
        or "\x00" in name
        or len(name.encode("utf-8", "surrogatepass")) > 256
    ):
        raise InvalidRequest(f"invalid environment variable name {name!r}", field=field)
    return name


class SandboxPolicy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The constraints an execution runs under (see the module docstring).

    ``memory_bytes``, ``pids`` and ``cpus`` are ``None`` for "no limit requested"; a set limit
    must be enforced by the backend or the run is refused
    (:func:`hub.core.execution.validate.validate_policy`).
    """

    network: NetworkPolicy = "disabled"
    filesystem: FilesystemPolicy = FilesystemPolicy()
    environment: EnvironmentPolicy = EnvironmentPolicy()
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_stdout_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_stderr_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    working_directory: str | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None

    def __post_init__(self) -> None:
        if self.network not in ("disabled", "enabled"):
            raise InvalidRequest(f"unknown network policy {self.network!r}", field="network")
        _check_int(self.timeout_ms, "timeoutMs", 1, MAX_TIMEOUT_MS)
        _check_int(self.max_stdout_bytes, "maxStdoutBytes", 0, 1 << 40)
        _check_int(self.max_stderr_bytes, "maxStderrBytes", 0, 1 << 40)
        if self.memory_bytes is not None:
            _check_int(self.memory_bytes, "memoryBytes", 4 * MIB, 1 << 50)
        if self.pids is not None:
            _check_int(self.pids, "pids", 1, 1 << 22)
        if self.cpus is not None and not (
            isinstance(self.cpus, int | float) and 0.01 <= self.cpus <= 1024
        ):
            raise InvalidRequest("cpus must be between 0.01 and 1024", field="cpus")
        if self.working_directory is not None:
            force_setattr(
                self,
                "working_directory",
                normalise_workspace_path(self.working_directory, "workingDirectory"),
            )

    def replace(self, **changes: object) -> SandboxPolicy:
        """A copy with ``changes`` (snake_case field names), validated again."""
        return msgspec.structs.replace(self, **changes)


def _check_int(value: object, field: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(f"{field} must be an integer in [{low}, {high}]", field=field)


# ---------------------------------------------------------------------------------------------
# Presets (adk-code's names)


def strict() -> SandboxPolicy:
    """Network off, no filesystem, no environment, 30 s, 1 MiB of stdout and of stderr."""
    return SandboxPolicy()


def host_local() -> SandboxPolicy:
    """For host-local backends: network on, the host filesystem (``host``: unrestricted), no
    environment, 30 s, 1 MiB each. Narrow it (e.g. network off) per instance or request."""
    return SandboxPolicy(network="enabled", filesystem=FilesystemPolicy.host())


def strict_js() -> SandboxPolicy:
    """:func:`strict` with a 5 s timeout (JavaScript isolates)."""
    return SandboxPolicy(timeout_ms=5_000)


def strict_python() -> SandboxPolicy:
    """:func:`strict` with a 10 s timeout (embedded Python sandboxes)."""
    return SandboxPolicy(timeout_ms=10_000)


# ---------------------------------------------------------------------------------------------
# Narrowing


class PolicyPatch(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """A request's policy as sent on the wire: every field optional; omitted = the instance's
    value. Unknown fields are refused (a typo must not silently widen nothing or everything)."""

    network: NetworkPolicy | None = None
    filesystem: FilesystemPolicy | None = None
    environment: EnvironmentPolicy | None = None
    timeout_ms: int | None = None
    max_stdout_bytes: int | None = None
    max_stderr_bytes: int | None = None
    working_directory: str | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None


def fs_within(requested: FilesystemPolicy, base: FilesystemPolicy) -> bool:
    """Whether ``requested`` gives no more filesystem access than ``base``.

    Order: ``none`` ≤ every mode ≤ ``host``; read-only ≤ read-write; a subtree ≤ its parent;
    ``paths`` lists compare path by path (a read-only path may sit under a read-only or a
    read-write path of the base, a read-write path only under a read-write one).
    """
    if requested.mode == "none" or base.mode == "host":
        return True
    if requested.mode == "host" or base.mode == "none":
        return False
    # Both are workspace modes or path lists: reduce each to (read-only roots, read-write roots).
    req_ro, req_rw = _fs_roots(requested)
    base_ro, base_rw = _fs_roots(base)
    readable = base_ro + base_rw
    return all(any(_path_within(p, r) for r in base_rw) for p in req_rw) and all(
        any(_path_within(p, r) for r in readable) for p in req_ro
    )


def _fs_roots(fs: FilesystemPolicy) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if fs.mode == "workspaceReadOnly":
        return (fs.root,), ()
    if fs.mode == "workspaceReadWrite":
        return (), (fs.root,)
    return fs.read_only, fs.read_write


def _env_within(requested: EnvironmentPolicy, base: EnvironmentPolicy) -> bool:
    if requested.mode == "none":
        return True
    return base.mode == "allowList" and set(requested.allow) <= set(base.allow)


def _narrow_int(field: str, base: int, requested: int | None) -> int:
    if requested is None:
        return base
    if requested > base:
        raise _above_limit(field, base, requested)
    return requested


def _narrow_optional(field: str, base: float | None, requested: float | None) -> float | None:
    """Like :func:`_narrow_int` for a limit the base may leave unset (``None`` = no limit)."""
    if requested is None:
        return base
    if base is not None and requested > base:
        raise _above_limit(field, base, requested)
    return requested


def _above_limit(field: str, base: float, requested: float) -> Rejected:
    return Rejected(
        f"{field} {requested} is above the backend instance's limit {base}",
        field=field,
        limit=base,
        requested=requested,
    )


def narrow(base: SandboxPolicy, requested: SandboxPolicy | PolicyPatch | None) -> SandboxPolicy:
    """The policy a request runs under: ``base`` (the instance's defaults) narrowed by
    ``requested``. ``None`` or an empty patch → ``base``.

    Raises :class:`Rejected` (``details['field']`` names the control) when ``requested`` is
    wider than ``base`` in any way: network enabled on a network-disabled instance, more
    filesystem access (see :func:`fs_within`), environment names outside the allow-list, or a
    larger timeout, output cap, memory, pids or cpu limit. A limit the base leaves unset
    (``None``) may be set to anything.
    """
    if requested is None:
        return base
    if requested.network == "enabled" and base.network == "disabled":
        raise Rejected(
            "network access requested but the backend instance has the network disabled",
            field="network",
        )
    network = requested.network or base.network
    filesystem = requested.filesystem or base.filesystem
    if not fs_within(filesystem, base.filesystem):
        raise Rejected(
            f"filesystem access {_describe_fs(filesystem)} is wider than the backend "
            f"instance allows ({_describe_fs(base.filesystem)})",
            field="filesystem",
        )
    environment = requested.environment or base.environment
    if not _env_within(environment, base.environment):
        extra = sorted(set(environment.allow) - set(base.environment.allow))
        raise Rejected(
            f"environment variables {extra} are not in the backend instance's allow list",
            field="environment",
            names=extra,
        )
    memory = _narrow_optional("memoryBytes", base.memory_bytes, requested.memory_bytes)
    pids = _narrow_optional("pids", base.pids, requested.pids)
    return SandboxPolicy(
        network=network,
        filesystem=filesystem,
        environment=environment,
        timeout_ms=_narrow_int("timeoutMs", base.timeout_ms, requested.timeout_ms),
        max_stdout_bytes=_narrow_int(
            "maxStdoutBytes", base.max_stdout_bytes, requested.max_stdout_bytes
        ),
        max_stderr_bytes=_narrow_int(
            "maxStderrBytes", base.max_stderr_bytes, requested.max_stderr_bytes
        ),
        working_directory=(
            requested.working_directory
            if requested.working_directory is not None
            else base.working_directory
        ),
        memory_bytes=None if memory is None else int(memory),
        pids=None if pids is None else int(pids),
        cpus=_narrow_optional("cpus", base.cpus, requested.cpus),
    )


def _describe_fs(fs: FilesystemPolicy) -> str:
    if fs.mode in ("workspaceReadOnly", "workspaceReadWrite"):
        return f"{fs.mode} at {fs.root!r}"
    if fs.mode == "paths":
        return f"paths (readOnly={list(fs.read_only)}, readWrite={list(fs.read_write)})"
    return fs.mode
