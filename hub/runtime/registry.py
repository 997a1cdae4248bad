"""The named backend instances a hub runs code on (``[[backends]]`` in agora.toml).

Each :class:`BackendInstance` is one configured backend: its ``id`` (what ``exec {backend}`` routes
by and what a token's ``backends`` claim names), its ``kind`` (``process``, ``container``,
``wasm``, ``python``, ``rust``, ``javascript``), its ``access`` (``read``: nothing the run changes
is written back to the workspace; ``read-write``) and its ``limits`` (the instance's default policy
— the widest a request may ask for — and the backend's own settings).

With no ``[[backends]]`` the hub has one instance of each kind, named after it (``javascript``'s is
``js``), in that order (``process`` first, so it is the default), with ``read-write`` access;
``wasm``, ``python``, ``rust`` and ``javascript`` only when their modules import here. An instance
is created even when it cannot run here (no Docker engine, no rustc):
:meth:`BackendInstance.available` says why, and ``exec`` on it is ``unavailable``.

``limits`` keys (docs/execution.md, "Runtime"): the policy fields ``network``, ``timeout_ms``,
``max_stdout_bytes``, ``max_stderr_bytes``, ``memory_bytes``, ``pids``, ``cpus``,
``working_directory``, ``env_allow`` (comma-separated names a request may set), and any keyword
argument of the backend's constructor (``max_concurrent``, ``warm_pool``, ``image``, …). Any other
key is a :class:`hub.config.ConfigError`.

The registry maps a kind to its backend class and nothing more: what the runtime prepares for a
run (a pushed workspace, host functions, the value harness) comes from the capabilities each
backend declares (:class:`hub.core.execution.capabilities.BackendCapabilities`). Arguments the
hub provides are passed by name to every backend whose constructor takes them: ``access``,
``blobs`` (the blob store), ``data_dir`` (the hub's data directory), ``settings`` (the
backend's own settings from ``[runtime]``, e.g. :class:`backends.rust.RustSettings`) and, in a
worker of ``agora serve --workers N``, ``worker`` and ``workers`` (its index and N: the
container backend labels and sweeps per worker).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from backends.base import (
    Admission,
    BackendCapabilities,
    BackendUnavailable,
    CodeExecutor,
    EnvironmentPolicy,
    ExecutionEvent,
    ExecutionIsolation,
    ExecutionLanguage,
    ExecutionRequest,
    SandboxPolicy,
    WorkspaceAccess,
)
from backends.staging import EtcStaging
from hub.config import BackendConfig, BackendKind
from hub.core.errors import AgoraError, ConfigError, NotFound
from hub.core.execution.policy import Access
from hub.core.execution.validate import CALLABLE_LANGUAGES
from hub.log.base import BlobStore

__all__ = [
    "KINDS",
    "BackendInfo",
    "BackendInstance",
    "BackendRegistry",
    "UnavailableBackend",
    "default_configs",
]

log = logging.getLogger("agora.runtime")

KINDS: Final[tuple[BackendKind, ...]] = (
    "process",
    "container",
    "wasm",
    "python",
    "rust",
    "javascript",
)
_MODULES: Final[dict[BackendKind, tuple[str, str]]] = {
    "process": ("backends.process", "ProcessBackend"),
    "container": ("backends.container", "ContainerBackend"),
    "wasm": ("backends.wasm", "WasmBackend"),
    "python": ("backends.monty", "PythonBackend"),
    "rust": ("backends.rust", "RustBackend"),
    "javascript": ("backends.javascript", "JavaScriptBackend"),
}
_OPTIONAL: Final[frozenset[str]] = frozenset({"wasm", "python", "rust", "javascript"})
# The id of a kind's default instance, where it is not the kind itself.
_DEFAULT_IDS: Final[dict[str, str]] = {"javascript": "js"}
_POLICY_KEYS: Final[frozenset[str]] = frozenset(
    {
        "network",
        "timeout_ms",
        "max_stdout_bytes",
        "max_stderr_bytes",
        "memory_bytes",
        "pids",
        "cpus",
        "working_directory",
        "env_allow",
    }
)
# Constructor arguments the registry sets itself (never from ``limits``).
_RESERVED: Final[frozenset[str]] = frozenset(
    {
        "name",
        "policy",
        "access",
        "blobs",
        "runner",
        "data_dir",
        "settings",
        "etc_staging",
        "worker",
        "workers",
    }
)


def _import(kind: BackendKind) -> tuple[type[Any] | None, str]:
    module_name, class_name = _MODULES[kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        return None, f"{module_name} does not import here: {e}"
    return getattr(module, class_name), ""


def default_configs() -> tuple[BackendConfig, ...]:
    """The instances of a hub without ``[[backends]]``: every kind whose module imports,
    named after the kind, ``read-write``."""
    kinds = [k for k in KINDS if k not in _OPTIONAL or _import(k)[0] is not None]
    return tuple(
        BackendConfig(id=_DEFAULT_IDS.get(k, k), kind=k, access="read-write") for k in kinds
    )


class UnavailableBackend:
    """Stands in for an instance whose backend cannot even be created here (its module does
    not import): never available, refuses every execution."""

    def __init__(self, name: str, reason: str) -> None:
        self._name = name
        self._reason = reason

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(isolation=ExecutionIsolation.IN_PROCESS, workspace="none")

    @property
    def default_policy(self) -> SandboxPolicy:
        return SandboxPolicy()

    def available(self) -> tuple[bool, str]:
        return False, self._reason

    async def start(self) -> None:
        return None

    async def probe(self) -> tuple[bool, str]:
        return self.available()

    async def admit(self, request: ExecutionRequest) -> Admission:
        raise BackendUnavailable(
            f"backend {self._name!r} is unavailable: {self._reason}", backend=self._name
        )

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncIterator[ExecutionEvent]:
        raise BackendUnavailable(
            f"backend {self._name!r} is unavailable: {self._reason}", backend=self._name
        )
        yield  # pragma: no cover  (an async generator that raises at once)

    async def cancel(self, exec_id: str) -> bool:
        return False

    async def aclose(self) -> None:
        return None

    def abandon(self) -> None:
        return None


class BackendInstance:
    """One configured backend instance (see the module docstring)."""

    __slots__ = ("access", "backend", "id", "kind", "limits")

    def __init__(
        self,
        id: str,
        kind: BackendKind,
        access: Access,
        backend: CodeExecutor,
        limits: dict[str, Any] | None = None,
    ) -> None:
        self.id = id
        self.kind = kind
        self.access = access
        self.backend = backend
        self.limits = dict(limits or {})

    def __repr__(self) -> str:
        return f"BackendInstance({self.id!r}, kind={self.kind!r}, access={self.access!r})"

    def available(self) -> tuple[bool, str]:
        return self.backend.available()

    @property
    def capabilities(self) -> BackendCapabilities:
        return self.backend.capabilities

    @property
    def callable(self) -> bool:
        """Whether it runs a language called with ``input`` (seed 003's callable backends)."""
        return bool(self.capabilities.languages & CALLABLE_LANGUAGES)

    @property
    def default_language(self) -> ExecutionLanguage:
        """The language of a request that names none: ``command`` where the backend runs it,
        else its only (or first) language."""
        languages = self.capabilities.languages
        if not languages or ExecutionLanguage.COMMAND in languages:
            return ExecutionLanguage.COMMAND
        return sorted(languages)[0]


def _policy_overrides(limits: dict[str, Any], where: str) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for key in _POLICY_KEYS & limits.keys():
        value = limits[key]
        if key == "env_allow":
            if not isinstance(value, str):
                raise ConfigError(f"{where}: limits.env_allow must be a string of names")
            names = [n.strip() for n in value.split(",") if n.strip()]
            changes["environment"] = EnvironmentPolicy.allow_list(names)
        else:
            changes[key] = value
    return changes


def build_instance(
    config: BackendConfig,
    *,
    blobs: BlobStore | None = None,
    data_dir: Path | None = None,
    settings: Mapping[str, object] | None = None,
    etc_staging: EtcStaging | None = None,
    worker: int | None = None,
    workers: int = 1,
    where: str = "backends",
) -> BackendInstance:
    """The instance ``config`` describes. ``settings``: the backends' own settings by kind
    (from ``[runtime]``), given as ``settings=`` to a backend whose constructor takes it;
    ``etc_staging``, the hub's one staged ``/etc`` (:mod:`backends.staging`), likewise;
    ``worker``/``workers``, this process's index among ``agora serve --workers`` (None: a
    hub of one process), likewise.
    Raises :class:`ConfigError` for an unknown or invalid ``limits`` key or value."""
    cls, problem = _import(config.kind)
    if cls is None:
        return BackendInstance(
            config.id, config.kind, config.access, UnavailableBackend(config.id, problem)
        )
    limits = dict(config.limits)
    policy_changes = _policy_overrides(limits, where)
    params = inspect.signature(cls).parameters
    kwargs: dict[str, Any] = {}
    for key, value in limits.items():
        if key in _POLICY_KEYS:
            continue
        if key in _RESERVED or key not in params or key.startswith("_"):
            known = sorted((set(params) - _RESERVED - {"self"}) | _POLICY_KEYS)
            raise ConfigError(
                f"{where}: unknown limit {key!r} for a {config.kind} backend "
                f"(known: {', '.join(known)})"
            )
        kwargs[key] = value
    provided: dict[str, object] = {
        "access": config.access,
        "blobs": blobs,
        "data_dir": data_dir,
        "etc_staging": etc_staging,
        "worker": worker,
        "workers": workers if worker is not None else None,
    }
    if settings is not None and config.kind in settings:
        provided["settings"] = settings[config.kind]
    for name, given in provided.items():
        if name in params and given is not None:
            kwargs[name] = given
    try:
        backend = cls(config.id, **kwargs)
        if policy_changes:
            base = backend.default_policy
            backend = cls(config.id, policy=base.replace(**policy_changes), **kwargs)
    except (TypeError, ValueError, AgoraError) as e:
        message = e.message if isinstance(e, AgoraError) else str(e)
        raise ConfigError(f"{where}: invalid limits for {config.id!r}: {message}") from e
    return BackendInstance(config.id, config.kind, config.access, backend, limits)


class BackendInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One row of ``agora backends`` (``--json``)."""

    id: str
    kind: str
    access: str
    default: bool
    available: bool
    reason: str
    capabilities: dict[str, Any]
    default_policy: dict[str, Any]


class BackendRegistry:
    """The hub's backend instances, in configuration order (the first is the default).

    Use as ``async with registry:`` or call :meth:`aclose`; backends start on first use or
    with :meth:`start_all`.
    """

    def __init__(
        self, instances: Iterable[BackendInstance], *, etc_staging: EtcStaging | None = None
    ) -> None:
        self._etc_staging = etc_staging  # what from_config shared among the instances
        self._instances: dict[str, BackendInstance] = {}
        for instance in instances:
            if instance.id in self._instances:
                raise ConfigError(f"duplicate backend id {instance.id!r}")
            self._instances[instance.id] = instance
        self._closed = False

    @classmethod
    def from_config(
        cls,
        configs: Sequence[BackendConfig],
        *,
        blobs: BlobStore | None = None,
        data_dir: Path | None = None,
        settings: Mapping[str, object] | None = None,
        worker: int | None = None,
        workers: int = 1,
    ) -> BackendRegistry:
        """Instances for ``configs`` (``[[backends]]``; empty → :func:`default_configs`),
        every confined one sharing one staged ``/etc``; ``worker`` of ``workers``: this
        process under ``agora serve --workers`` (see :func:`build_instance`). Raises
        :class:`ConfigError`."""
        configs = tuple(configs) or default_configs()
        etc_staging = EtcStaging()
        instances = [
            build_instance(
                c,
                blobs=blobs,
                data_dir=data_dir,
                settings=settings,
                etc_staging=etc_staging,
                worker=worker,
                workers=workers,
                where=f"backends[{i}] ({c.id})",
            )
            for i, c in enumerate(configs)
        ]
        return cls(instances, etc_staging=etc_staging)

    def __iter__(self) -> Any:
        return iter(list(self._instances.values()))

    def __len__(self) -> int:
        return len(self._instances)

    @property
    def ids(self) -> list[str]:
        return list(self._instances)

    @property
    def default_id(self) -> str | None:
        """The first instance's id (what an ``exec`` without ``backend`` runs on)."""
        return next(iter(self._instances), None)

    def get(self, backend: str | None) -> BackendInstance:
        """The instance ``backend`` (``None``: the first). Raises :class:`NotFound`."""
        if backend is None:
            backend = self.default_id
            if backend is None:
                raise NotFound("this hub has no backend instances", field="backend")
        instance = self._instances.get(backend)
        if instance is None:
            raise NotFound(
                f"no backend instance {backend!r} (this hub has: {', '.join(self.ids) or 'none'})",
                backend=backend,
                field="backend",
            )
        return instance

    async def start_all(self) -> None:
        """Start every instance (concurrently); a failure is logged, never raised (the
        instance then reports itself unavailable)."""

        async def start(instance: BackendInstance) -> None:
            try:
                await instance.backend.start()
            except Exception:
                log.exception("backend %s failed to start", instance.id)
            ok, why = instance.available()
            if not ok:
                log.warning("backend %s (%s) is unavailable: %s", instance.id, instance.kind, why)

        await asyncio.gather(*(start(i) for i in self._instances.values()))

    def abandon(self) -> None:
        """Give up on every instance's pending calls (:meth:`CodeExecutor.abandon
        <backends.base.CodeExecutor.abandon>`): the hub's stop is not waiting any longer."""
        for instance in self._instances.values():
            instance.backend.abandon()

    async def aclose(self) -> None:
        """Close every instance (stopping what runs). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for instance in reversed(list(self._instances.values())):
            try:
                await instance.backend.aclose()
            except Exception:
                log.exception("backend %s failed to close", instance.id)
        if self._etc_staging is not None:
            await self._etc_staging.aclose()

    async def __aenter__(self) -> BackendRegistry:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def describe(self, *, probe: bool = True) -> list[BackendInfo]:
        """Each instance with its capabilities and availability. With ``probe``, instances
        are probed first without side effects on running hubs (a container instance only
        checks the engine and the image; it does not sweep or start containers)."""
        rows: list[BackendInfo] = []
        default = self.default_id
        for instance in self._instances.values():
            ok, why = await instance.backend.probe() if probe else instance.available()
            rows.append(
                BackendInfo(
                    id=instance.id,
                    kind=instance.kind,
                    access=instance.access,
                    default=instance.id == default,
                    available=ok,
                    reason=why,
                    capabilities=msgspec.to_builtins(instance.capabilities),
                    default_policy=msgspec.to_builtins(instance.backend.default_policy),
                )
            )
        return rows
