"""hub.observe.tracing: one trace across a publish and an execution. The Hub runs in this
test's loop (an ``agora serve`` subprocess cannot share an in-memory exporter) with a
``TracerProvider`` of its own exporting to an ``InMemorySpanExporter``; the client speaks over
a real WebSocket. The client's ``traceparent`` is kept by the stored events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hub.config import parse_config
from hub.log.factory import open_store
from hub.observe.tracing import Tracing, provider_for
from hub.server.app import Hub
from tests.support.hub import BANNER_TIMEOUT
from tests.support.peer import ExecPeer, exec_peer, message, open_peer
from tests.support.tokens import make_signer, mint_exec

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
async def traced(tmp_path: Path) -> AsyncIterator[tuple[Hub, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = parse_config({"backends": [{"id": "process", "kind": "process"}]})
    config = config.with_overrides(port=0, data=tmp_path / "traced")
    store = open_store(None, config.storage.data_dir)
    hub = Hub(config, store, make_signer(), tracing=Tracing(provider))
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(hub.run(stop, on_ready=lambda _url: ready.set()))
    async with asyncio.timeout(BANNER_TIMEOUT):
        await ready.wait()
    try:
        yield hub, exporter
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task


async def test_one_trace_across_a_publish_and_an_execution(
    traced: tuple[Hub, InMemorySpanExporter],
) -> None:
    hub, exporter = traced
    assert hub.url is not None
    async with open_peer(ExecPeer, hub.url) as p:
        await p.send({"op": "hello", "token": mint_exec(), "traceparent": TRACEPARENT})
        assert (await p.recv())["op"] == "welcome"
        ack = await p.publish("w", message("run the tests", traceparent=TRACEPARENT))
        assert ack["op"] == "ack", ack
        result = await p.run(source="echo hi", traceparent=TRACEPARENT)
        assert result["status"] == "completed", result
        events = await p.log("w")

    for _ in range(200):  # the exec span ends just after execFinished commits
        spans = {s.name: s for s in exporter.get_finished_spans()}
        if "agora.exec" in spans:
            break
        await asyncio.sleep(0.02)
    publish, run = spans["agora.publish"], spans["agora.exec"]
    for span in (spans["agora.hello"], publish, run):
        assert f"{span.context.trace_id:032x}" == TRACE_ID  # the client's trace
        assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
    # publish → decide → append → fan-out: the publish span's children, in that order.
    steps = [
        s
        for s in exporter.get_finished_spans()
        if s.parent is not None and s.parent.span_id == publish.context.span_id
    ]
    assert [s.name for s in sorted(steps, key=lambda s: s.start_time or 0)] == [
        "agora.decide",
        "agora.append",
        "agora.fanout",
    ]
    assert all(s.attributes and s.attributes["agora.workspace"] == "w" for s in steps)
    assert run.attributes is not None and run.attributes["agora.status"] == "completed"
    assert run.attributes["agora.backend"] == "process"

    by_kind = {e["kind"]: e for e in events}
    assert by_kind["messagePosted"]["traceparent"] == TRACEPARENT  # kept as sent
    # The request: the client's context or the run's span (the run's task may start first).
    assert by_kind["execRequested"]["traceparent"].startswith(f"00-{TRACE_ID}-")
    exec_span = f"00-{TRACE_ID}-{run.context.span_id:016x}-01"
    assert by_kind["execFinished"]["traceparent"] == exec_span  # the run's own span


async def test_a_frame_traceparent_is_kept_and_a_bad_one_refused(
    traced: tuple[Hub, InMemorySpanExporter],
) -> None:
    hub, _ = traced
    assert hub.url is not None
    async with exec_peer(hub.url) as p:
        ack = await p.publish("w", message("framed"), traceparent=TRACEPARENT)
        assert ack["op"] == "ack", ack
        for bad in ("00-" + "0" * 32 + "-" + PARENT_ID + "-01", "hello", TRACEPARENT.upper()):
            refused = await p.publish("w", message("x", traceparent=bad))
            assert (refused["op"], refused["code"]) == ("error", "badRequest"), refused
            refused = await p.publish("w", message("x"), traceparent=bad)
            assert (refused["op"], refused["code"]) == ("error", "badRequest"), refused
        events = await p.log("w")
    assert [e["payload"]["text"] for e in events if e["kind"] == "messagePosted"] == ["framed"]
    assert events[-1]["traceparent"] == TRACEPARENT


def test_tracing_off_records_nothing_and_none_has_no_provider() -> None:
    off = Tracing()
    with off.span("agora.publish", TRACEPARENT) as span:
        assert span is None
    assert not off.enabled and provider_for("none") is None
