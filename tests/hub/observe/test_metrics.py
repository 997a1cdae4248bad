"""hub.observe.metrics over a real ``agora serve``: /metrics scraped after a session, with the
counters matching the events the log holds, the closes, the rate-limited publish and the
execution."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hub.observe.metrics import HubMetrics, merge_expositions
from tests.support.hub import HubStarter
from tests.support.peer import exec_peer, message, peer
from tests.support.tokens import mint

CONFIG = """
[[backends]]
id = "process"
kind = "process"

[limits]
publish_rate = 0.01
publish_burst = 3
"""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[HubStarter]:
    hubs = HubStarter(tmp_path)
    yield hubs
    hubs.close()


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient() as http:
        reply = await http.get(url + "/metrics")
    assert reply.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_after_a_session_match_the_log(starter: HubStarter) -> None:
    hub = starter.start(CONFIG, http_port=0)
    before = await scrape(hub.http_url)
    async with peer(hub.url, mint()) as p:
        for text in ("one", "two", "three"):
            assert (await p.publish("w", message(text)))["op"] == "ack"
        limited = await p.publish("w", message("four"))
        assert limited["code"] == "rateLimited", limited
        async with exec_peer(hub.url) as e:
            result = await e.run(source="echo hi")
            assert result["status"] == "completed", result
        during = await scrape(hub.http_url)
        assert value(during, "agora_connections") == 1.0
        head = await p.head("w")
    await asyncio.sleep(0.3)  # the hub's close bookkeeping runs after the client's close
    after = await scrape(hub.http_url)

    appended = value(after, "agora_events_appended_total") - value(
        before, "agora_events_appended_total"
    )
    assert appended == head  # every event of the session is in workspace w
    batches = value(after, "agora_append_batch_events_count") - value(
        before, "agora_append_batch_events_count"
    )
    assert 4 <= batches <= head  # three publishes and at least one runtime batch
    assert (
        value(after, "agora_append_batch_events_sum")
        - value(before, "agora_append_batch_events_sum")
        == appended
    )
    assert value(after, "agora_store_commit_requests_total") >= batches
    assert value(after, "agora_store_commit_seconds_count") >= 1
    assert value(after, "agora_request_errors_total", code="rateLimited") == 1.0
    assert value(after, "agora_executions_total", backend="process", status="completed") == 1.0
    assert value(after, "agora_execution_seconds_count", backend="process") == 1.0
    assert value(after, "agora_connection_closes_total", code="1000", by="client") == 2.0
    assert value(after, "agora_connections") == 0.0
    assert value(after, "agora_store_errors_total") == 0.0
    assert ("agora_recovery_seconds", frozenset()) in after


def test_two_hubs_in_one_process_share_no_series() -> None:
    one, two = HubMetrics(), HubMetrics()
    one.committed("w", [object()] * 3)
    assert one.registry.get_sample_value("agora_events_appended_total") == 3.0
    assert two.registry.get_sample_value("agora_events_appended_total") == 0.0


def test_heartbeat_lags_keep_only_the_nodes_last_told() -> None:
    metrics = HubMetrics()
    metrics.heartbeats([("a", 0.5), ("b", 1.5)])
    metrics.heartbeats([("a", 0.25)])
    get = metrics.registry.get_sample_value
    assert get("agora_cluster_heartbeat_lag_seconds", {"node": "a"}) == 0.25
    assert get("agora_cluster_heartbeat_lag_seconds", {"node": "b"}) is None


def test_merged_expositions_label_every_series_with_its_worker() -> None:
    """``--workers N``: one family per name, each worker's series under its ``worker``
    label, and ``agora_worker_up`` 0 for a worker whose metrics did not come."""
    workers = [HubMetrics(), HubMetrics()]
    workers[0].committed("a", [object()] * 3)
    workers[1].committed("b", [object()] * 5)
    workers[1].request_failed("conflict")
    merged = merge_expositions(
        {"0": workers[0].exposition(), "1": workers[1].exposition(), "2": None}
    ).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    values = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in families.values()
        for s in f.samples
        if not s.name.endswith("_created")
    }
    assert values[("agora_events_appended_total", frozenset({("worker", "0")}))] == 3
    assert values[("agora_events_appended_total", frozenset({("worker", "1")}))] == 5
    errors = frozenset({("code", "conflict"), ("worker", "1")})
    assert values[("agora_request_errors_total", errors)] == 1
    assert families["agora_append_batch_events"].type == "histogram"
    up = {s.labels["worker"]: s.value for s in families["agora_worker_up"].samples}
    assert up == {"0": 1, "1": 1, "2": 0}
    assert merged.count("# TYPE agora_events_appended_total counter") == 1
