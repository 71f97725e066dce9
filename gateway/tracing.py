"""Opt-in OpenTelemetry tracing, configured by the standard OTEL_* variables.

Off unless they ask for it: OTEL_TRACES_EXPORTER=otlp|console (comma list), or an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with no exporter named;
OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none keep it off. An empty variable counts as
unset (Compose passes unset ones as empty). The SDK reads the rest itself: OTEL_SERVICE_NAME
(default here `bert-gateway`), OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG),
OTEL_EXPORTER_OTLP_(TRACES_)HEADERS / _TIMEOUT / _COMPRESSION, OTEL_BSP_*. OTLP goes over
HTTP/protobuf.

The HTTP server span is FastAPI's own (its native OpenTelemetry support, `FastAPI(telemetry=...)`).
Below it: `tokenize`, `queue` (a caller's wait for its first batch), `batch` (one scheduler batch:
child of its oldest caller's request, linked to the other callers' requests), `triton` (one
gRPC call; its traceparent goes to Triton as gRPC metadata, so Triton's own spans join the
trace) and `serialize`. Off, every helper returns a shared no-op at the cost of a global read:
no SDK object is made per request, and the SDK is not even imported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind

if TYPE_CHECKING:
    import asyncio

    from fastapi.telemetry import TelemetryConfig
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger("gateway.tracing")

SERVICE_NAME = "bert-gateway"
_EXPORTERS = ("otlp", "console")
_OFF: AbstractContextManager[Any] = nullcontext()

_tracer: trace.Tracer | None = None
_owned: Any = None  # the SDK provider made from the environment (flushed and shut down at close)


def enabled() -> bool:
    """Whether spans are being made."""
    return _tracer is not None


def requested_exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The span exporters the OTEL_* variables ask for (empty: tracing off)."""
    def get(name: str) -> str:
        return environ.get(name, "").strip()

    if get("OTEL_SDK_DISABLED").lower() == "true":
        return []
    named = get("OTEL_TRACES_EXPORTER").lower()
    if not named:
        endpoint = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    exporters = [e.strip() for e in named.split(",") if e.strip() and e.strip() != "none"]
    unknown = [e for e in exporters if e not in _EXPORTERS]
    if unknown:
        log.warning("OTEL_TRACES_EXPORTER: %s not supported here (only %s); ignored", unknown, "/".join(_EXPORTERS))
    protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if "otlp" in exporters and protocol != "http/protobuf":
        log.warning("OTLP protocol %r not supported here (only http/protobuf); no OTLP export", protocol)
        exporters.remove("otlp")
    return [e for e in exporters if e in _EXPORTERS]


def _provider_from_env() -> Any:
    """An SDK TracerProvider with the exporters the environment asks for, or None."""
    for name in [k for k, v in os.environ.items() if k.startswith("OTEL_") and not v.strip()]:
        del os.environ[name]  # empty = unset, also for the SDK's own readers
    exporters = requested_exporters()
    if not exporters:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # the process-wide one too, for any other instrumented library
    log.info("tracing on: exporters %s, service %s", ",".join(exporters), resource.attributes.get("service.name"))
    return provider


def configure(provider: trace.TracerProvider | None = None) -> trace.TracerProvider | None:
    """Make spans with `provider`, or with the one the OTEL_* variables ask for; off when neither.
    Returns the provider in use."""
    global _tracer, _owned
    shutdown()
    if provider is None:
        provider = _owned = _provider_from_env()
    _tracer = provider.get_tracer("gateway") if provider is not None else None
    return provider


def shutdown() -> None:
    """Stop making spans; flush and shut down the provider made from the environment."""
    global _tracer, _owned
    _tracer = None
    owned, _owned = _owned, None
    if owned is not None:
        owned.shutdown()


def fastapi_telemetry(provider: trace.TracerProvider | None, untraced: Collection[str]) -> TelemetryConfig:
    """FastAPI's own telemetry settings: its HTTP server span with `provider` (none without one) for every
    path but `untraced` (probes and scrapes: noise, not traffic), no FastAPI metrics or logs (Prometheus
    and our JSON lines do that), no exporters of its own."""

    def excluded(scope: MutableMapping[str, Any]) -> bool:
        return scope.get("path") in untraced

    return {
        "tracer_provider": provider,
        "tracing": provider is not None,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
        "exclude": excluded,
    }


def route_selected(method: str, route: str) -> None:
    """Name the current server span by its route template, as FastAPI's routing does (the edge serves its routes
    without that routing, api/asgi.py)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)


def _attributes(attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    return {f"gateway.{key}": value for key, value in attributes.items()}


def _tracer_in_trace() -> trace.Tracer | None:
    """The tracer, when the current context is a recording span: work outside a traced request
    (probes, background discovery) makes no orphan traces."""
    tracer = _tracer
    if tracer is None or not trace.get_current_span().is_recording():
        return None
    return tracer


def span(name: str, **attributes: AttributeValue) -> AbstractContextManager[Any]:
    """A span `name` (attributes prefixed `gateway.`) around the block, child of the current one."""
    tracer = _tracer_in_trace()
    if tracer is None:
        return _OFF
    return tracer.start_as_current_span(name, attributes=_attributes(attributes))


def triton_call(model: str, rows: int, transport: str, protocol: str = "grpc"
                ) -> AbstractContextManager[dict[str, str] | None]:
    """The `triton` span around one Triton inference call (`protocol`: grpc or http); yields the call's
    metadata or headers (`traceparent`, `tracestate`) that make Triton's spans its children, or None
    (tracing off, or not sampled: Triton 2.51 traces by its own rate and ignores the sampled flag)."""
    tracer = _tracer_in_trace()
    if tracer is None:
        return _OFF
    return _triton_call(tracer, model, rows, transport, protocol)


@contextmanager
def _triton_call(tracer: trace.Tracer, model: str, rows: int, transport: str, protocol: str
                 ) -> Iterator[dict[str, str] | None]:
    attributes = {"rpc.system": protocol, "rpc.method": "ModelInfer",
                  **_attributes({"model": model, "rows": rows, "transport": transport})}
    with tracer.start_as_current_span("triton", kind=SpanKind.CLIENT, attributes=attributes) as current:
        if not current.get_span_context().trace_flags.sampled:
            yield None
            return
        metadata: dict[str, str] = {}
        propagate.inject(metadata)
        yield metadata


class Waiting:
    """One caller of a batch scheduler in its trace: the request's context, and its `queue` span
    (open until its first batch starts, or it leaves)."""

    __slots__ = ("context", "queue")

    def __init__(self, context: otel_context.Context, queue: trace.Span) -> None:
        self.context = context
        self.queue: trace.Span | None = queue

    def served(self) -> None:
        if self.queue is not None:
            self.queue.end()
            self.queue = None


def queued(step: str, rows: int, future: asyncio.Future[Any]) -> Waiting | None:
    """Start the `queue` span of a caller whose `rows` wait for batches of `step`, ended by its
    first batch or when `future` (its result) is done; None when tracing is off."""
    tracer = _tracer_in_trace()
    if tracer is None:
        return None
    context = otel_context.get_current()
    waiting = Waiting(context, tracer.start_span("queue", context, attributes=_attributes({"model": step, "rows": rows})))
    future.add_done_callback(lambda _: waiting.served())
    return waiting


def batch(step: str, callers: Iterable[Waiting | None], **attributes: AttributeValue) -> AbstractContextManager[Any]:
    """The `batch` span of one scheduler batch, current around its Triton call: a child of its oldest
    caller's request (callers oldest first), with links to the other callers' requests. Ends the
    callers' `queue` spans."""
    tracer = _tracer
    if tracer is None:
        return _OFF
    waiting = list(dict.fromkeys(w for w in callers if w is not None))
    if not waiting:
        return _OFF
    for w in waiting:
        w.served()
    links = [Link(c) for w in waiting[1:] if (c := trace.get_current_span(w.context).get_span_context()).is_valid]
    attributes = {"model": step, "callers": len(waiting), **attributes}
    return tracer.start_as_current_span("batch", waiting[0].context, links=links, attributes=_attributes(attributes))


def trace_id() -> str | None:
    """The current trace id (32 hex digits) for log lines, or None."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
