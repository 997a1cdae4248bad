"""The hub's Prometheus metrics (``GET /metrics`` on the HTTP port; docs/operations.md).

One :class:`HubMetrics` per hub, each with its own ``CollectorRegistry`` (no global state: two
hubs in one process, as in tests, never share a series). The hot path pays at most an int
add per event: appends are counted per committed batch (a Workspaces listener), commit
latency per transaction (the store's group-commit writer), gauges (connections,
subscriptions, fan-out queue depth) are read only when scraped, and errors, closes and
executions are counted where they happen, which is rare by comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["BATCH_BUCKETS", "WORKER_LABEL", "WORKER_UP", "HubMetrics", "merge_expositions"]

BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
"""Events per committed batch."""
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
EXEC_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)


class HubMetrics:
    """Every metric of one hub (names per Prometheus conventions: ``agora_…_total`` counters,
    ``_seconds`` durations). The ``bind_*`` methods attach the gauges read at scrape time."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events_appended = Counter(
            "agora_events_appended", "Events appended to the log (all workspaces).", registry=r
        )
        self.batch_events = Histogram(
            "agora_append_batch_events",
            "Events per committed batch (one publish, one runtime write, or a connection's "
            "pipelined publishes to a workspace, folded together).",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "agora_store_commit_seconds",
            "Duration of one store transaction of the group-commit writer (many appends).",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.commit_requests = Counter(
            "agora_store_commit_requests",
            "Append requests committed by the group-commit writer.",
            registry=r,
        )
        self.store_errors = Counter(
            "agora_store_errors", "Store transactions that raised (the writer stops).", registry=r
        )
        self.request_errors = Counter(
            "agora_request_errors",
            "WebSocket requests answered with an error, by wire code (rateLimited: rate-limited).",
            ["code"],
            registry=r,
        )
        self.closes = Counter(
            "agora_connection_closes",
            "WebSocket connections closed, by close code and by whom (hub or client).",
            ["code", "by"],
            registry=r,
        )
        self.executions = Counter(
            "agora_executions",
            "Executions finished, by backend instance and status.",
            ["backend", "status"],
            registry=r,
        )
        self.execution_seconds = Histogram(
            "agora_execution_seconds",
            "Wall time of an execution from its start to its execFinished, by backend.",
            ["backend"],
            buckets=EXEC_BUCKETS,
            registry=r,
        )
        self.recovery_seconds = Gauge(
            "agora_recovery_seconds",
            "Time the last start spent recovering (executions, presence) before serving.",
            registry=r,
        )
        self.heartbeat_lag = Gauge(
            "agora_cluster_heartbeat_lag_seconds",
            "Seconds since each cluster node's last heartbeat, as this node last saw it.",
            ["node"],
            registry=r,
        )

    def exposition(self) -> bytes:
        """This hub's metrics in the Prometheus text format (synchronous, but bounded by the
        metric count: no per-event series)."""
        return generate_latest(self.registry)

    # -- hooks the parts call --------------------------------------------------------------------

    def committed(self, workspace: str, batch: Sequence[Any]) -> None:
        """The Workspaces listener: one committed batch (an int add for its events)."""
        if batch:
            self.events_appended.inc(len(batch))
            self.batch_events.observe(len(batch))

    def commit(self, requests: int, seconds: float, failed: bool) -> None:
        """The store's writer: one transaction of ``requests`` appends."""
        if failed:
            self.store_errors.inc()
            return
        self.commit_requests.inc(requests)
        self.commit_seconds.observe(seconds)

    def request_failed(self, code: str) -> None:
        self.request_errors.labels(code=code).inc()

    def closed(self, code: int, by: str) -> None:
        self.closes.labels(code=str(code), by=by).inc()

    def execution_finished(self, backend: str, status: str, seconds: float) -> None:
        self.executions.labels(backend=backend, status=status).inc()
        self.execution_seconds.labels(backend=backend).observe(seconds)

    def heartbeats(self, lags: Iterable[tuple[str, float]]) -> None:
        """The cluster's view of each running node: (node id, seconds since its last beat);
        a node no longer listed (stopped, reaped) loses its series."""
        self.heartbeat_lag.clear()
        for node, lag in lags:
            self.heartbeat_lag.labels(node=node).set(lag)

    # -- gauges read when scraped ----------------------------------------------------------------

    def bind_gauges(
        self,
        *,
        connections: Callable[[], float],
        subscriptions: Callable[[], float],
        fanout_queued: Callable[[], float],
        executions_running: Callable[[], float],
    ) -> None:
        """Gauges computed at scrape time from the hub's own counts (nothing on the hot path)."""
        gauges = (
            ("agora_connections", "Open WebSocket connections.", connections),
            ("agora_subscriptions", "Live workspace subscriptions.", subscriptions),
            (
                "agora_fanout_queue_frames",
                "Frames queued to subscribers, all connections (fan-out queue depth).",
                fanout_queued,
            ),
            ("agora_executions_running", "Executions running on this node.", executions_running),
        )
        for name, doc, read in gauges:
            Gauge(name, doc, registry=self.registry).set_function(read)

    def bind_mcp_gauges(
        self, *, sessions: Callable[[], float], watchers: Callable[[], float]
    ) -> None:
        """The ``/mcp`` door's gauges (hub.mcp.http), read at scrape time: its open sessions
        and its token watchers (one per open session; more would be a leak)."""
        gauges = (
            ("agora_mcp_sessions", "Open MCP Streamable HTTP sessions.", sessions),
            (
                "agora_mcp_token_watchers",
                "MCP sessions' token watchers running (one per open session).",
                watchers,
            ),
        )
        for name, doc, read in gauges:
            Gauge(name, doc, registry=self.registry).set_function(read)


WORKER_LABEL: Final = "worker"
"""The label :func:`merge_expositions` adds to every series: the worker's index."""
WORKER_UP: Final = "agora_worker_up"
"""1 for each worker whose metrics are in the scrape, 0 for one that could not be reached."""


def merge_expositions(parts: Mapping[str, bytes | None]) -> bytes:
    """One Prometheus text exposition of the whole hub of ``agora serve --workers N``
    (docs/operations.md, "Workers"): every worker's own exposition (``parts``, by worker
    index; None for a worker that could not be reached, a restarting one), each series with a
    ``worker`` label added, the families of one name merged under one ``HELP``/``TYPE``, and
    :data:`WORKER_UP` saying which workers are in. Raises ``ValueError`` for a part that is
    not the text format."""
    families: dict[str, Metric] = {}
    up = Metric(WORKER_UP, "Whether this worker's metrics are in this scrape.", "gauge")
    for worker, text in parts.items():
        up.add_sample(WORKER_UP, {WORKER_LABEL: worker}, 0.0 if text is None else 1.0)
        if text is None:
            continue
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = Metric(family.name, family.documentation, family.type, family.unit)
                families[family.name] = merged
            for sample in family.samples:
                labels = {**sample.labels, WORKER_LABEL: worker}
                merged.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families.values(), up]))
    return generate_latest(registry)


class _Families:
    """A collector of metric families already gathered (:func:`merge_expositions`)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
