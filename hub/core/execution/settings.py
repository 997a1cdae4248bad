"""The execution runtime's settings: the ``[runtime]`` table of agora.toml, one type. Pure.

:class:`RuntimeSettings` is both what :mod:`hub.config` parses from ``[runtime]`` (with its
sub-tables ``[runtime.sync]`` and ``[runtime.rust]``) and what :class:`hub.runtime.Runtime`
runs with: every default is written here once, and the composition root (``agora serve``,
:class:`hub.server.app.Hub`) builds the settings once from the configuration. The full
reference is in docs/operations.md ("Configuration file") and docs/execution.md ("Runtime").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final

import msgspec

__all__ = ["RUST_CACHE_ENV", "RuntimeSettings", "RustSettings", "SyncLimits"]

_Positive = Annotated[int, msgspec.Meta(ge=1)]
_Seconds = Annotated[float, msgspec.Meta(gt=0)]

RUST_CACHE_ENV: Final = "AGORA_RUST_CACHE"
"""The environment variable that overrides ``[runtime.rust] cache_dir`` (read once, by the
composition root, through :meth:`RustSettings.resolved`)."""

_TOOLCHAIN_ENV: Final = ("HOME", "RUSTUP_HOME", "CARGO_HOME", "RUSTUP_TOOLCHAIN")
_DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"


class _Table(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the tables: an unknown key is an error (a typo must not leave a default)."""


class SyncLimits(_Table, frozen=True):
    """``[runtime.sync]``: bounds of one push and one pull. Over ``max_push_*`` the push fails;
    a pulled file over ``max_file_bytes`` is skipped (``tooLarge``); changes beyond
    ``max_changes`` are skipped (``tooMany``)."""

    max_push_files: _Positive = 100_000
    max_push_bytes: _Positive = 1024 * 1024 * 1024
    max_file_bytes: _Positive = 16 * 1024 * 1024
    max_changes: _Positive = 10_000


class RustSettings(_Table, frozen=True):
    """``[runtime.rust]``: where the ``rust`` backend keeps its builds and finds its crates.

    ``cache_dir``: compiled binaries and the serde_json build (default, resolved by
    :meth:`resolved`: ``$AGORA_RUST_CACHE``, else ``$XDG_CACHE_HOME/agora/rust``, else
    ``~/.cache/agora/rust``). ``registry``: the offline crate directory serde_json is built
    from (Debian's ``librust-serde-json-dev``). ``tool_env``: the environment rustc and cargo
    run with (filled by :meth:`resolved` from the hub's: ``PATH``, ``HOME``, ``RUSTUP_HOME``,
    ``CARGO_HOME``, ``RUSTUP_TOOLCHAIN``; nothing else of the hub's environment reaches them).
    """

    cache_dir: str | None = None
    registry: str = "/usr/share/cargo/registry"
    tool_env: dict[str, str] = {}

    @property
    def is_resolved(self) -> bool:
        """Whether :meth:`resolved` filled these in (a cache directory and a toolchain
        ``PATH`` set), so that a backend uses them as they are."""
        return self.cache_dir is not None and "PATH" in self.tool_env

    def resolved(self, environ: Mapping[str, str]) -> RustSettings:
        """These settings with what the environment decides filled in: the cache directory
        (``$AGORA_RUST_CACHE`` wins over the file) and the toolchain's environment."""
        cache_dir = environ.get(RUST_CACHE_ENV) or self.cache_dir
        if not cache_dir:
            base = environ.get("XDG_CACHE_HOME") or f"{environ.get('HOME', '/tmp')}/.cache"
            cache_dir = f"{base}/agora/rust"
        tool_env = {"PATH": environ.get("PATH", _DEFAULT_PATH), "LANG": "C.UTF-8"}
        tool_env |= {name: environ[name] for name in _TOOLCHAIN_ENV if name in environ}
        return msgspec.structs.replace(self, cache_dir=cache_dir, tool_env=tool_env | self.tool_env)


class RuntimeSettings(_Table, frozen=True):
    """``[runtime]``: the execution runtime's bounds (seed 003's defaults)."""

    max_executions: _Positive = 24
    """Executions running at once per hub; more → ``busy``."""
    max_readers: _Positive = 8
    """Live ``getExec`` readers per execution; more → ``busy``."""
    journal_cache_bytes: _Positive = 64 * 1024 * 1024
    """About this many bytes of execution journals are kept in memory; beyond it the least
    recently used journals without readers are evicted and reloaded from the log on demand."""
    retention_keep: _Positive = 100
    """Finished executions always kept per workspace."""
    retention_window_s: Annotated[int, msgspec.Meta(ge=0)] = 3600
    """Finished executions beyond the newest ``retention_keep`` and older than this are
    disposed (``execDisposed`` with ``reason: "retention"``; 0: as soon as they are beyond)."""
    retention_sweep_s: _Seconds = 60.0
    """How often retention is applied to every loaded journal (age alone can make an
    execution prunable)."""
    coalesce_interval_s: _Seconds = 0.050
    """Output is journaled at most this long after it was produced (chunks in between are
    coalesced into one ``execOutput``)."""
    coalesce_bytes: _Positive = 64 * 1024
    """…or as soon as this many bytes of one stream are waiting."""
    output_queue: _Positive = 64
    """Chunks buffered between a backend and the journal (back-pressure beyond)."""
    stop_grace_s: _Seconds = 3.0
    """How long ``kill`` (or shutdown) waits for the backend to stop a run before the runtime
    closes the run's stream itself (which kills the program) and records it as killed."""
    close_grace_s: _Seconds = 10.0
    """How long a stopping hub waits for its runs to stop and be recorded, then as long again
    for its backends to close (remove their sandboxes), before it goes on without them: a
    backend whose engine stopped answering does not hold the stop. A run left so is recorded
    ``failed/interrupted`` at the next start, whose sweep removes the sandboxes left."""
    eager_start: bool = False
    """Start every backend instance when the runtime starts rather than on first use
    (``agora serve`` sets it)."""
    sync: SyncLimits = SyncLimits()
    rust: RustSettings = RustSettings()

    @property
    def retention_window_ms(self) -> int:
        return self.retention_window_s * 1000

    def backend_settings(self) -> dict[str, object]:
        """The backends' own settings by kind (what the registry gives as ``settings=``)."""
        return {"rust": self.rust}
