"""hub/runtime/registry.py and ``agora backends``: instances from the configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends.base import ExecutionLanguage
from hub.config import BackendConfig, ConfigError
from hub.core.errors import NotFound
from hub.runtime.registry import BackendRegistry, UnavailableBackend, default_configs
from tests.support.paths import REPO
from tests.support.require import require


def test_no_config_means_one_instance_of_each_kind() -> None:
    configs = default_configs()
    assert [c.id for c in configs] == ["process", "container", "wasm", "python", "rust", "js"]
    assert {c.access for c in configs} == {"read-write"}
    registry = BackendRegistry.from_config(())
    assert registry.default_id == "process" and registry.ids == [c.id for c in configs]


def test_instances_from_config() -> None:
    registry = BackendRegistry.from_config(
        [
            BackendConfig(id="sh-ro", kind="process", access="read"),
            BackendConfig(
                id="box",
                kind="container",
                access="read",
                limits={"memory_bytes": 64 * 1024 * 1024, "warm_pool": 0, "timeout_ms": 5000},
            ),
            BackendConfig(
                id="sh-net", kind="process", access="read-write", limits={"network": "enabled"}
            ),
            BackendConfig(id="py", kind="python", limits={"env_allow": "A, B"}),
        ]
    )
    assert registry.default_id == "sh-ro"
    box = registry.get("box")
    policy = box.backend.default_policy
    assert (policy.memory_bytes, policy.timeout_ms) == (64 * 1024 * 1024, 5000)
    assert policy.filesystem.mode == "workspaceReadOnly"  # access read → a read-only mount
    assert registry.get("sh-net").backend.default_policy.network == "enabled"
    assert registry.get("sh-ro").backend.default_policy.network == "disabled"  # strict default
    assert registry.get("py").backend.default_policy.environment.allow == ("A", "B")
    assert registry.get(None).id == "sh-ro"
    assert registry.get("py").default_language == ExecutionLanguage.PYTHON
    assert registry.get("sh-ro").capabilities.workspace == "files"
    assert registry.get("py").capabilities.workspace == "hostFunctions"
    assert not box.callable and registry.get("py").callable
    with pytest.raises(NotFound) as e:
        registry.get("nope")
    assert e.value.details["backend"] == "nope"


def test_bad_limits_and_duplicates_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown limit 'bogus'"):
        BackendRegistry.from_config([BackendConfig(id="x", kind="process", limits={"bogus": 1})])
    with pytest.raises(ConfigError, match="invalid limits"):
        BackendRegistry.from_config(
            [BackendConfig(id="x", kind="process", limits={"timeout_ms": -1})]
        )
    with pytest.raises(ConfigError, match="duplicate"):
        BackendRegistry(
            [
                BackendRegistry.from_config([BackendConfig(id="x", kind="process")]).get("x"),
                BackendRegistry.from_config([BackendConfig(id="x", kind="process")]).get("x"),
            ]
        )


async def test_describe_and_an_unavailable_instance() -> None:
    registry = BackendRegistry.from_config([BackendConfig(id="p", kind="process")])
    registry._instances["gone"] = type(registry.get("p"))(
        "gone", "wasm", "read", UnavailableBackend("gone", "wasmtime does not import")
    )
    async with registry:
        rows = await registry.describe()
    assert [(r.id, r.default, r.available) for r in rows] == [
        ("p", True, True),
        ("gone", False, False),
    ]
    assert rows[1].reason == "wasmtime does not import"
    assert "command" in rows[0].capabilities["languages"]


def _agora(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_agora_backends_lists_instances(tmp_path: Path) -> None:
    config = tmp_path / "agora.toml"
    config.write_text(
        '[[backends]]\nid = "ro"\nkind = "process"\naccess = "read"\n'
        '[[backends]]\nid = "rw"\nkind = "process"\naccess = "read-write"\n'
    )
    table = _agora("backends", "--config", str(config))
    as_json = _agora("backends", "--config", str(config), "--json")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[backends]]\nid = "x"\nkind = "process"\nlimits = { nope = 1 }\n')
    refused = _agora("backends", "--config", str(bad))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "KIND", "ACCESS", "AVAILABLE"]
    assert lines[1].split()[:5] == ["ro", "*", "process", "read", "yes"]
    rows = json.loads(as_json.stdout)
    assert [(r["id"], r["access"], r["available"]) for r in rows] == [
        ("ro", "read", True),
        ("rw", "read-write", True),
    ]
    assert rows[0]["defaultPolicy"]["network"] == "disabled"
    assert refused.returncode == 2 and "unknown limit 'nope'" in refused.stderr


def test_agora_backends_without_config_lists_every_kind() -> None:
    result = _agora("backends", "--json")
    assert result.returncode == 0, result.stderr
    assert [r["kind"] for r in json.loads(result.stdout)] == [
        "process",
        "container",
        "wasm",
        "python",
        "rust",
        "javascript",
    ]


CONTROLS = ("network", "filesystem", "environment", "timeout", "memory", "pids", "cpu")


def test_agora_backends_shows_the_process_backend_confined_and_what_it_enforces() -> None:
    """Issue 12, safe defaults: a fresh configuration's ``process`` instance is ``namespace``
    isolated (bubblewrap), and ``agora backends`` shows the isolation and the controls it
    enforces on this host (or, without bubblewrap, that it is unavailable and why)."""
    table = _agora("backends")
    as_json = _agora("backends", "--json")
    assert table.returncode == 0 and as_json.returncode == 0, table.stderr
    [row] = [r for r in json.loads(as_json.stdout) if r["id"] == "process"]
    require("bwrap", row["available"], row["reason"])
    caps = row["capabilities"]
    assert caps["isolation"] == "namespace"
    enforced = [c for c in CONTROLS if caps[f"enforces{c.capitalize()}"]]
    # Always: network, filesystem, environment, timeout and memory (a cgroup, else RLIMIT_AS);
    # pids and cpu only where the host has those cgroups.
    assert enforced[:5] == list(CONTROLS[:5]), enforced
    header, line = table.stdout.splitlines()[:2]
    assert header.split()[4:] == ["ISOLATION", "LANGUAGES", "ENFORCES"]
    assert line.split()[:6] == ["process", "*", "process", "read-write", "yes", "namespace"]
    assert line.split()[-1] == ",".join(enforced)
