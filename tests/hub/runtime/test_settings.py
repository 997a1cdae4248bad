"""The runtime's one settings type (hub/core/execution/settings.py) as ``[runtime]`` of
agora.toml, and how the composition root hands it out: to the session (``max_exec_waits``),
the runtime and the backends (``[runtime.rust]``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backends.container import ContainerBackend, owner_label
from backends.rust import RustBackend
from hub.auth import TokenSigner
from hub.config import BackendConfig, ConfigError, HubConfig, parse_config
from hub.core.execution.settings import RuntimeSettings, RustSettings, SyncLimits
from hub.log.factory import open_store
from hub.runtime import BackendRegistry
from hub.runtime import RuntimeSettings as Exported
from hub.server.app import Hub


def test_one_type_from_the_file_to_the_runtime() -> None:
    assert Exported is RuntimeSettings
    config = parse_config(
        {
            "runtime": {
                "max_executions": 3,
                "stop_grace_s": 0.5,
                "sync": {"max_changes": 7},
                "rust": {"cache_dir": "/tmp/agora-rust-test", "registry": "/opt/crates"},
            }
        }
    )
    settings = config.runtime
    assert isinstance(settings, RuntimeSettings)
    assert (settings.max_executions, settings.stop_grace_s) == (3, 0.5)
    assert settings.sync == SyncLimits(max_changes=7)
    assert settings.rust.registry == "/opt/crates"
    assert settings.backend_settings() == {"rust": settings.rust}
    assert HubConfig().runtime == RuntimeSettings()  # every default written once, there


@pytest.mark.parametrize(
    ("table", "where"),
    [
        ({"max_concurrent": 3}, "runtime"),  # the old field name is not a key
        ({"sync": {"max_files": 1}}, "runtime.sync"),
        ({"rust": {"cache": "/x"}}, "runtime.rust"),
        ({"max_exec_waits": 5}, "runtime"),  # a session limit: [limits] max_exec_waits
    ],
)
def test_unknown_or_invalid_keys_are_errors(table: dict[str, object], where: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"runtime": table}, source="agora.toml")
    assert where in raised.value.message and "agora.toml" in raised.value.message


def test_rust_settings_resolve_the_documented_override_once() -> None:
    environ = {"AGORA_RUST_CACHE": "/from/env", "PATH": "/bin", "HOME": "/home/u", "OTHER": "x"}
    resolved = RustSettings(cache_dir="/from/file").resolved(environ)
    assert resolved.cache_dir == "/from/env"  # the variable wins over the file
    assert resolved.tool_env == {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/home/u"}
    assert RustSettings(cache_dir="/f").resolved({"HOME": "/h"}).cache_dir == "/f"
    assert RustSettings().resolved({"HOME": "/h"}).cache_dir == "/h/.cache/agora/rust"
    xdg = RustSettings().resolved({"XDG_CACHE_HOME": "/x", "HOME": "/h"})
    assert xdg.cache_dir == "/x/agora/rust"


def test_the_rust_backend_takes_its_settings(tmp_path: Path) -> None:
    settings = RustSettings(
        cache_dir=str(tmp_path / "cache"), registry=str(tmp_path / "crates"), tool_env={"PATH": "/"}
    )
    backend = RustBackend(settings=settings)
    assert backend.toolchain.cache_dir == tmp_path / "cache"
    assert backend.toolchain.registry == tmp_path / "crates"
    assert backend.toolchain.env == {"PATH": "/"}  # no other environment reaches rustc


def test_the_rust_backend_reads_no_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The override is the composition root's to apply (agora serve), never the backend's.
    monkeypatch.setenv("AGORA_RUST_CACHE", str(tmp_path / "from-env"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    defaults = RustSettings().resolved({})  # the settings type's own, environment-free
    backend = RustBackend()
    assert backend.toolchain.cache_dir == Path(defaults.cache_dir or "")
    assert backend.toolchain.env == defaults.tool_env
    assert str(tmp_path) not in str(backend.toolchain.env)
    unresolved = RustSettings(cache_dir=str(tmp_path / "file"))
    assert RustBackend(settings=unresolved).toolchain.cache_dir == tmp_path / "file"
    resolved = unresolved.resolved(os.environ)  # as agora serve does, once
    assert RustBackend(settings=resolved).toolchain.cache_dir == tmp_path / "from-env"


def test_the_composition_root_hands_the_settings_out(tmp_path: Path) -> None:
    config = parse_config(
        {
            "storage": {"data": str(tmp_path / "data")},
            "limits": {"max_exec_waits": 5},
            "runtime": {"max_executions": 2},
            "backends": [{"id": "sh", "kind": "process"}],
        }
    )
    hub = Hub(config, open_store(None, tmp_path / "data"), TokenSigner(b"s" * 32))
    assert hub.config.limits.max_exec_waits == 5  # the session's limits are [limits] as is
    assert hub.runtime.settings is config.runtime
    assert hub.runtime.node == hub.node_id


def test_the_registry_gives_each_backend_its_settings_by_name(tmp_path: Path) -> None:
    rust = RustSettings(cache_dir=str(tmp_path / "rust"), tool_env={"PATH": "/bin"})
    registry = BackendRegistry.from_config(
        [BackendConfig(id="r", kind="rust"), BackendConfig(id="box", kind="container")],
        data_dir=tmp_path / "data",
        settings={"rust": rust},
    )
    backend = registry.get("r").backend
    assert isinstance(backend, RustBackend)
    assert backend.toolchain.cache_dir == tmp_path / "rust"
    container = registry.get("box").backend
    assert isinstance(container, ContainerBackend)
    assert container.owner == owner_label(tmp_path / "data")  # one per data directory
    # access "read" (the default) is the container's read-only workspace mount
    assert container.default_policy.filesystem.mode == "workspaceReadOnly"
