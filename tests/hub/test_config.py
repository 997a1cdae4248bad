"""Tests for hub.config: defaults, the TOML file, and overrides."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from hub.config import (
    BackendConfig,
    ConfigError,
    HubConfig,
    PeerConfig,
    load_config,
    parse_config,
    validate_backend_id,
)
from hub.core.capability import Capability
from hub.core.errors import BadRequest
from hub.core.validation import DEFAULT_LIMITS, EVENT_FRAME_RESERVE
from hub.core.wire.session import ServerSession, SessionLimits

FULL = """
[server]
host = "0.0.0.0"
port = 9000
http_port = 9001

[limits]
max_frame_bytes = 2097152
max_batch_events = 100
publish_rate = 500
publish_burst = 1000
send_queue = 128
max_subscriptions = 8
garbage_limit = 5
max_exec_waits = 7
max_file_bytes = 1048576
blob_threshold = 4096
snapshot_every = 50

[storage]
data = "/var/lib/agora"
store = "postgresql://agora@db/agora"

[[backends]]
id = "sh"
kind = "process"
access = "read-write"
limits = { timeout_ms = 30000, max_output_bytes = 1048576 }

[[backends]]
id = "wasm-1"
kind = "wasm"

[[a2a.peers]]
name = "reviewer"
card_url = "https://reviewer.example/.well-known/agent-card.json"
token = "abc"
"""


def write(tmp_path: Path, text: str, name: str = "agora.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load_config(None)
    assert config == HubConfig()
    assert config.server.host == "127.0.0.1"
    assert (config.server.port, config.server.http_port) == (8765, 8766)
    limits = config.limits
    assert limits.max_frame_bytes == 1024 * 1024
    assert limits.max_batch_events == 256
    assert limits.blob_threshold == 64 * 1024
    assert limits.snapshot_every == 1000
    assert limits.garbage_limit == 20
    assert limits.max_file_bytes == DEFAULT_LIMITS.max_file_bytes
    assert config.storage.data == "./agora-data"
    assert config.storage.data_dir == Path("agora-data")
    assert config.storage.store is None
    assert config.backends == ()
    assert config.a2a.peers == ()


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == HubConfig()


def test_full_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.server.host == "0.0.0.0"
    assert config.server.port == 9000 and config.server.http_port == 9001
    assert config.limits.publish_rate == 500.0
    assert config.limits.send_queue == 128
    assert config.limits.max_exec_waits == 7
    assert config.storage.data_dir == Path("/var/lib/agora")
    assert config.storage.store == "postgresql://agora@db/agora"
    assert config.backends == (
        BackendConfig(
            id="sh",
            kind="process",
            access="read-write",
            limits={"timeout_ms": 30000, "max_output_bytes": 1048576},
        ),
        BackendConfig(id="wasm-1", kind="wasm"),
    )
    assert config.backends[1].access == "read"  # the safe default
    assert config.a2a.peers == (
        PeerConfig(
            name="reviewer",
            card_url="https://reviewer.example/.well-known/agent-card.json",
            token="abc",
        ),
    )


def test_draft_limits(tmp_path: Path) -> None:
    limits = load_config(write(tmp_path, FULL)).limits.draft_limits()
    assert limits.max_file_bytes == 1048576
    assert limits.blob_threshold == 4096
    # an event frame (the stored event plus the frame around it) fits in max_frame_bytes
    assert limits.max_event_bytes == 2097152 - EVENT_FRAME_RESERVE


@pytest.mark.parametrize(
    ("text", "key", "where"),
    [
        ("[server]\nprot = 1\n", "prot", "server"),
        ("[limits]\nmax_frame_byte = 1\n", "max_frame_byte", "limits"),
        ("[stroage]\ndata = 'x'\n", "stroage", "top level"),
        ("debug = true\n", "debug", "top level"),
        ("[[backends]]\nid = 'a'\nkind = 'wasm'\nimage = 'x'\n", "image", "backends[0]"),
        ("[[a2a.peers]]\nname = 'p'\ncard_url = 'https://x'\nurl = 'y'\n", "url", "a2a.peers[0]"),
    ],
)
def test_unknown_key_names_key_and_file(tmp_path: Path, text: str, key: str, where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    message = excinfo.value.message
    assert str(path) in message
    assert f"unknown key `{key}`" in message
    assert where in message
    assert excinfo.value.details["source"] == str(path)
    assert excinfo.value.code == "badRequest"
    # the operator's fault, not a client's: a bad config is never a ClientError
    assert excinfo.value.blame == "operator"
    assert not isinstance(excinfo.value, BadRequest)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[server]\nport = '80'\n", "server.port"),
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nport = -1\n", "server.port"),
        ("[server]\nhost = ''\n", "server.host"),
        ("[limits]\nmax_batch_events = 0\n", "limits.max_batch_events"),
        ("[limits]\npublish_rate = 0\n", "limits.publish_rate"),
        ("[limits]\nsend_queue = true\n", "limits.send_queue"),
        ("[limits]\nsend_queue = 1.5\n", "limits.send_queue"),
        ("[storage]\ndata = 3\n", "storage.data"),
        ("server = 1\n", "server"),
        ("[[backends]]\nkind = 'wasm'\n", "id"),
        ("[[backends]]\nid = 'a'\nkind = 'vm'\n", "backends[0].kind"),
        ("[[backends]]\nid = 'a'\nkind = 'wasm'\naccess = 'all'\n", "backends[0].access"),
        ("[[backends]]\nid = 'a'\nkind = 'wasm'\nlimits = { x = [1] }\n", "backends[0].limits"),
        ("[[backends]]\nid = 'a b'\nkind = 'wasm'\n", "backends[0].id"),
        ("[[backends]]\nid = 'a'\nkind = 'wasm'\n[[backends]]\nid = 'a'\nkind = 'rust'\n",
         "duplicate backend id 'a'"),
        ("[[a2a.peers]]\nname = 'p'\ncard_url = 'ftp://x'\n", "a2a.peers[0].card_url"),
        ("[[a2a.peers]]\nname = 'p'\ncard_url = 'https://x'\n[[a2a.peers]]\nname = 'p'\n"
         "card_url = 'https://y'\n", "duplicate peer name 'p'"),
        ("[a2a.push]\nallowed_networks = ['10.0.0.0/33']\n", "a2a.push.allowed_networks[0]"),
        ("[a2a.push]\nmax_attempts = 0\n", "a2a.push.max_attempts"),
        ("[a2a.push]\nallow_loopback = 'yes'\n", "a2a.push.allow_loopback"),
        ("[a2a]\ngrpc_port = 70000\n", "a2a.grpc_port"),
    ],
)  # fmt: skip
def test_invalid_values(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert fragment in excinfo.value.message
    assert str(path) in excinfo.value.message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml")


def test_not_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[server\nport = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML") as excinfo:
        load_config(path)
    assert str(path) in excinfo.value.message


def test_parse_config_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"^inline: unknown key `x` in top level$"):
        parse_config({"x": 1}, source="inline")


def test_overrides(tmp_path: Path) -> None:
    base = load_config(write(tmp_path, FULL))
    same = base.with_overrides()
    assert same == base
    changed = base.with_overrides(host="::1", port=0, data=tmp_path / "d", store="sqlite:///x")
    assert changed.server.host == "::1"
    assert changed.server.port == 0
    assert changed.server.http_port == 9001  # kept
    assert changed.storage.data_dir == tmp_path / "d"
    assert changed.storage.store == "sqlite:///x"
    assert changed.backends == base.backends
    assert base.server.port == 9000  # the original is untouched (frozen)


def test_override_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"server\.port"):
        HubConfig().with_overrides(port=70000)


@pytest.mark.parametrize("value", ["py", "wasm-1", "a.b_c", "x" * 128])
def test_backend_id_ok(value: str) -> None:
    assert validate_backend_id(value) == value


@pytest.mark.parametrize("value", ["", ".", "..", "a b", "a/b", "x" * 129, "*"])
def test_backend_id_bad(value: str) -> None:
    with pytest.raises(BadRequest):
        validate_backend_id(value)


def test_runtime_table(tmp_path: Path) -> None:
    path = tmp_path / "agora.toml"
    path.write_text("[runtime]\nmax_executions = 3\nretention_window_s = 60\n")
    config = load_config(path)
    assert config.runtime.max_executions == 3
    assert config.runtime.retention_window_s == 60
    assert config.runtime.max_readers == 8 and config.runtime.retention_keep == 100
    path.write_text("[runtime]\nmax_executions = 0\n")
    with pytest.raises(ConfigError):
        load_config(path)
    path.write_text("[runtime]\nmax_execution = 3\n")
    with pytest.raises(ConfigError, match="max_execution"):
        load_config(path)


def test_limits_are_the_session_limits(tmp_path: Path) -> None:
    """``[limits]`` is a :class:`SessionLimits` (one set of defaults, no copy): what the file
    says is what every session enforces, ``max_exec_waits`` included."""
    assert isinstance(HubConfig().limits, SessionLimits)
    defaults = HubConfig().limits
    for field in msgspec.structs.fields(SessionLimits):
        assert getattr(defaults, field.name) == field.default, field.name
    path = write(tmp_path, "[limits]\nmax_exec_waits = 3\nmax_subscriptions = 2\n")
    limits = load_config(path).limits
    session = ServerSession(_never_verified, limits=limits)
    assert session.limits is limits  # passed down as it is, not copied field by field
    assert session.limits.max_exec_waits == 3
    assert session.limits.max_subscriptions == 2
    path.write_text("[limits]\nmax_exec_waits = 0\n")
    with pytest.raises(ConfigError, match=r"limits\.max_exec_waits"):
        load_config(path)


def _never_verified(token: str) -> Capability:
    raise AssertionError("no token is checked here")


def test_a2a_port_is_read_as_the_old_name_of_http_port() -> None:
    assert parse_config({"server": {"a2a_port": 9005}}).server.http_port == 9005
    with pytest.raises(ConfigError, match=r"old name of server\.http_port"):
        parse_config({"server": {"a2a_port": 9005, "http_port": 9006}})


def test_url_host_names_an_unspecified_address_by_its_loopback_and_brackets_ipv6() -> None:
    from hub.config import url_host

    assert url_host("0.0.0.0") == "127.0.0.1"
    assert url_host("::") == "[::1]"
    assert url_host("::1") == "[::1]"
    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("hub.example") == "hub.example"
