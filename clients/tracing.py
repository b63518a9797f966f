"""Traces (OpenTelemetry): off by default, turned on by the standard ``OTEL_*`` variables.

The rule, read once per process (``configure_tracing``, called by the ``ledger`` CLI for
every command, so ``ledger worker``, ``ledger api``, the operator commands and ``ledger
mcp`` all follow it):

1. ``OTEL_SDK_DISABLED=true`` (any case): off, whatever else is set.
2. ``OTEL_TRACES_EXPORTER`` set and not empty: off if it says ``none``, else on with the
   exporters it names (``otlp``, ``console``; ``otlp`` is OTLP over HTTP/protobuf, the only
   protocol shipped: ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL=grpc`` is refused).
3. Otherwise on exactly when an OTLP endpoint is set: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
   or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the SDK's own default, localhost:4318, is never
   assumed: nothing is exported unless someone said where).

On, the SDK's provider and a batch processor with the exporter are made, and every other
``OTEL_*`` variable (service name, resource attributes, sampler, batch sizes, headers,
timeout) is the SDK's to read. Off, nothing of the SDK is imported: spans come from the
API's no-op tracer, which still passes a parent's context on (an agent's trace reaches a
receiver that traces even through a worker that does not), and the worker skips its own
span work altogether (``enabled()``). An agent that configured its own SDK sees the
publisher's spans whatever these variables say: the publisher uses only the API.

The context travels as the W3C ``traceparent`` header: on each ``DeliveryRequested`` Kafka
record (clients/publisher.py), then on the worker's requests to the receiver.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from events.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACER_NAME = "delivery-ledger"
# The attributes every delivery span carries (README, Tracing).
KEY_ATTRIBUTE = "ledger.idempotency_key"
TOKEN_ATTRIBUTE = "ledger.fencing_token"  # noqa: S105 - an attribute name
# version-traceid-parentid-flags, lower-case hex (W3C Trace Context, level 1).
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_W3C = TraceContextTextMapPropagator()
_EXPORTERS = ("otlp", "console")

_provider: TracerProvider | None = None


def tracing_wanted(env: Mapping[str, str]) -> bool:
    """Whether ``env`` turns tracing on (the rule in the module's docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if names := _exporter_names(env):
        return names != ["none"]
    return any(
        env.get(name, "").strip()
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "")
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


def configure_tracing(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Make the SDK's provider and exporter if ``env`` (the process's) turns tracing on;
    returns whether it is on. Idempotent. A setting it cannot follow is a ``ConfigError``."""
    global _provider
    if _provider is not None:
        return True
    env = os.environ if env is None else env
    if not tracing_wanted(env):
        return False
    names = _exporter_names(env) or ["otlp"]
    unknown = [name for name in names if name not in (*_EXPORTERS, "none")]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {unknown[0]!r}, an exporter delivery-ledger does not ship",
            "use otlp (OTLP over HTTP/protobuf), console or none",
        )
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    ) or "http/protobuf"
    if "otlp" in names and protocol.strip() != "http/protobuf":
        raise ConfigError(
            f"OTLP protocol {protocol.strip()!r} is not shipped: traces go over http/protobuf",
            "unset OTEL_EXPORTER_OTLP_PROTOCOL (or set it to http/protobuf) and point "
            "OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)",
        )
    # The SDK only now: a process with tracing off never loads it.
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the command's own name.
    attributes: dict[str, Any] = {"service.name": service_name}
    attributes.update(OTELResourceDetector().detect().attributes)
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            continue
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("tracing on: service %s, exporters %s", service_name, ",".join(names))
    return True


def enabled() -> bool:
    """True once ``configure_tracing`` turned tracing on in this process."""
    return _provider is not None


def shutdown_tracing() -> None:
    """Export what is buffered and stop the exporter (the SDK also does it at exit)."""
    if _provider is not None:
        _provider.force_flush()


# The API's proxy: it follows whichever provider is set, before or after this import, and
# saves asking the provider for a tracer per span.
_TRACER = trace.get_tracer(TRACER_NAME)


def tracer() -> Tracer:
    """The ledger's tracer: the SDK's when on (ours or an agent's), else the API's no-op."""
    return _TRACER


def traceparent_in(headers: Sequence[tuple[str, bytes]]) -> str | None:
    """The valid W3C ``traceparent`` among Kafka record headers, if any (a malformed one
    is ignored: it is a hint for traces, never a reason to refuse a record)."""
    for name, value in headers:
        if name == TRACEPARENT:
            return checked_traceparent(value.decode("ascii", "replace"))
    return None


def checked_traceparent(value: str | None) -> str | None:
    """``value`` if it is a well-formed ``traceparent`` (version 00's form), else None."""
    if value is None or len(value) != 55 or not _TRACEPARENT.fullmatch(value):
        return None
    return value


def context_of(traceparent: str | None) -> Context | None:
    """The context whose parent is ``traceparent`` (None: the current one)."""
    if traceparent is None:
        return None
    return _W3C.extract({TRACEPARENT: traceparent})


def traceparent_of(span: Span) -> str | None:
    """``span``'s context as a ``traceparent`` value (None for an invalid span)."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def current_traceparent() -> str | None:
    """The current span's context as a ``traceparent`` value, if there is a valid one."""
    return traceparent_of(trace.get_current_span())


@contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """Open a span named ``name`` (child of ``parent``, a ``traceparent``, or of the current
    span), current inside the block; an exception marks it failed and goes on.

    The one way our code (and the MCP tools: ``span("ledger.mcp.delivery_status",
    {...})``) opens a span. Off, it is the API's no-op span: a few microseconds.
    """
    with tracer().start_as_current_span(
        name, context=context_of(parent), kind=kind, attributes=dict(attributes or {})
    ) as opened:
        yield opened
