"""OpenTelemetry traces of the hub (docs/operations.md, "Tracing"); off unless asked for.

One :class:`Tracing` per hub, over a ``TracerProvider`` of its own (never the process-global
one: two hubs in a process, as in tests, do not mix spans). Without a provider every
:meth:`Tracing.span` is a no-op that costs one ``if``: nothing on the hot path.

A client continues its own trace by sending a W3C ``traceparent`` on a frame (any client
frame; on ``publish`` it is also kept by each draft without one) or on an event draft; the
hub's spans are its children, and the events a traced action writes keep the trace context in
their optional ``traceparent`` envelope field, so one trace follows an agent's action through
the hub, the runtime and the A2A bridge (also in the log, long after the spans are gone).

Exporters (``agora serve --traces``): ``none`` (default), ``console`` (spans as JSON on
stderr) and ``otlp`` (OTLP over HTTP, the optional extra ``agora-hub[otlp]``; the endpoint and
headers come from the standard ``OTEL_EXPORTER_OTLP_*`` environment variables).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Final, Literal

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hub import __version__

__all__ = ["EXPORTERS", "Tracing", "provider_for"]

Exporter = Literal["none", "console", "otlp"]
EXPORTERS: Final[tuple[Exporter, ...]] = ("none", "console", "otlp")
_PROPAGATOR: Final = TraceContextTextMapPropagator()
Attributes = Mapping[str, str | int | float | bool]


class Tracing:
    """The hub's tracer (``provider``: None, tracing off)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer = (
            provider.get_tracer("agora-hub", __version__) if provider is not None else None
        )

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        traceparent: str | None = None,
        *,
        attributes: Attributes | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Iterator[Span | None]:
        """A span named ``name``, the child of ``traceparent`` when given (a validated W3C
        value), else of the current span; ``None`` (and nothing recorded) when off."""
        if self._tracer is None:
            yield None
            return
        context = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        with self._tracer.start_as_current_span(
            name, context=context, kind=kind, attributes=attributes
        ) as span:
            yield span

    @staticmethod
    def traceparent(span: Span | None) -> str | None:
        """The W3C ``traceparent`` naming ``span`` (what the events it writes keep)."""
        if span is None or not span.get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier.get("traceparent")

    async def aclose(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()  # flushes the batch processor (bounded by its timeout)


def provider_for(exporter: Exporter, *, service: str = "agora-hub") -> TracerProvider | None:
    """A provider exporting with ``exporter`` (``none``: None). Raises ``ImportError`` naming
    the extra when ``otlp`` is asked for without it installed."""
    if exporter == "none":
        return None
    span_exporter: SpanExporter
    if exporter == "console":
        span_exporter = ConsoleSpanExporter(out=sys.stderr)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise ImportError(
                "--traces otlp needs the OTLP exporter: pip install 'agora-hub[otlp]'"
            ) from e
        span_exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider
