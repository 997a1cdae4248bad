"""Cluster settings: ``[cluster]`` in agora.toml, the ``AGORA_*`` environment overrides that
``agora serve`` applies over it, and node ids (hub.cluster.settings); then a real node that
takes its id and timing from the file, and one whose environment wins over the file."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from hub.cluster.settings import NODE_ID_RE, new_node_id, resolve_node_id
from hub.commands.serve import CLUSTER_ENV, with_cluster_env
from hub.config import ClusterConfig, ConfigError, HubConfig, load_config
from tests.support.hub import StartHub
from tests.support.postgres import POSTGRES_DSN

CLEAR_ENV = {name: "" for name in CLUSTER_ENV}
"""An empty variable counts as unset: the node then runs on its agora.toml alone."""


def test_defaults() -> None:
    cluster = HubConfig().cluster
    assert cluster == ClusterConfig(node_id=None, heartbeat_s=2.0, timeout_s=10.0)
    assert (cluster.owners, cluster.url) == (False, None)


def test_cluster_table(tmp_path: Path) -> None:
    path = tmp_path / "agora.toml"
    path.write_text('[cluster]\nnode_id = "n-1"\nheartbeat_s = 0.5\ntimeout_s = 3\n')
    assert load_config(path).cluster == ClusterConfig(node_id="n-1", heartbeat_s=0.5, timeout_s=3)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('node_id = "a b"', "invalid node id 'a b' at cluster.node_id"),
        ('node_id = ""', "invalid node id '' at cluster.node_id"),
        ("heartbeat_s = 0", "cluster.heartbeat_s"),
        ("timeout_s = -1", "cluster.timeout_s"),
        ("heartbeat_s = 10", "cluster.heartbeat_s (10) must be less than cluster.timeout_s (10)"),
        ("timeout_s = 1", "cluster.heartbeat_s (2) must be less than cluster.timeout_s (1)"),
        ("heartbeat = 1", "unknown key `heartbeat` in cluster"),
        ('timeout_s = "10"', "cluster.timeout_s"),
    ],
)
def test_invalid_cluster_table(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "agora.toml"
    path.write_text(f"[cluster]\n{text}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert fragment in excinfo.value.message
    assert str(path) in excinfo.value.message


def test_environment_overrides_the_file() -> None:
    base = HubConfig().with_overrides(node_id="from-file", heartbeat_s=1.0, timeout_s=5.0)
    env = {"AGORA_NODE_ID": "from-env", "AGORA_NODE_TIMEOUT_S": "7.5", "OTHER": "x"}
    cluster = with_cluster_env(base, env).cluster
    assert cluster == ClusterConfig(node_id="from-env", heartbeat_s=1.0, timeout_s=7.5)
    assert with_cluster_env(base, {}) is base
    assert with_cluster_env(base, CLEAR_ENV) is base  # empty: unset


@pytest.mark.parametrize(("text", "owners"), [("true", True), ("1", True), ("No", False)])
def test_the_environment_sets_owners_and_the_url(text: str, owners: bool) -> None:
    env = {"AGORA_CLUSTER_OWNERS": text, "AGORA_NODE_URL": "ws://10.0.0.11:8765"}
    cluster = with_cluster_env(HubConfig(), env).cluster
    assert (cluster.owners, cluster.url) == (owners, "ws://10.0.0.11:8765")


@pytest.mark.parametrize(
    ("env", "fragment", "source"),
    [
        ({"AGORA_HEARTBEAT_S": "soon"}, "AGORA_HEARTBEAT_S must be a number", "AGORA_HEARTBEAT_S"),
        ({"AGORA_NODE_TIMEOUT_S": "0"}, "cluster.timeout_s", "AGORA_NODE_TIMEOUT_S"),
        ({"AGORA_NODE_TIMEOUT_S": "inf"}, "cluster.timeout_s", "AGORA_NODE_TIMEOUT_S"),
        ({"AGORA_HEARTBEAT_S": "20"}, "must be less than cluster.timeout_s", "AGORA_HEARTBEAT_S"),
        ({"AGORA_NODE_ID": "a/b"}, "invalid node id 'a/b'", "AGORA_NODE_ID"),
        ({"AGORA_CLUSTER_OWNERS": "maybe"}, "must be true or false", "AGORA_CLUSTER_OWNERS"),
        ({"AGORA_NODE_URL": "http://x:1"}, "cluster.url", "AGORA_NODE_URL"),
        ({"AGORA_NODE_URL": "ws://a b"}, "cluster.url", "AGORA_NODE_URL"),
    ],
)
def test_bad_environment_names_the_variable(
    env: dict[str, str], fragment: str, source: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        with_cluster_env(HubConfig(), env)
    assert fragment in excinfo.value.message
    assert source in excinfo.value.details["source"]


def test_node_ids() -> None:
    fresh = new_node_id()
    assert NODE_ID_RE.fullmatch(fresh)
    assert fresh != new_node_id()
    assert resolve_node_id(ClusterConfig(node_id="pinned")) == "pinned"
    assert NODE_ID_RE.fullmatch(resolve_node_id(ClusterConfig()))


async def registered(url_schema: str) -> list[str]:
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        rows = await conn.fetch(f'SELECT node_id FROM "{url_schema}".nodes ORDER BY node_id')
    finally:
        await conn.close()
    return [r["node_id"] for r in rows]


@pytest.mark.slow
async def test_a_node_takes_its_cluster_settings_from_agora_toml(
    pg_url: str, pg_schema: str, start_node: StartHub
) -> None:
    node = start_node(
        pg_url,
        config='[cluster]\nnode_id = "toml-node"\nheartbeat_s = 0.3\ntimeout_s = 2\n',
        **CLEAR_ENV,
    )
    assert await registered(pg_schema) == ["toml-node"]
    assert "node toml-node joined the cluster" in node.log()


@pytest.mark.slow
async def test_the_environment_wins_over_agora_toml(
    pg_url: str, pg_schema: str, start_node: StartHub
) -> None:
    start_node(pg_url, "env-node", config='[cluster]\nnode_id = "toml-node"\n')
    assert await registered(pg_schema) == ["env-node"]
