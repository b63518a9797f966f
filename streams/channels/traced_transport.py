"""The worker's HTTP transport, instrumented: each request a client span (tracing on only).

OpenTelemetry's httpx instrumentation wraps the one transport every channel shares, so a
webhook, a Slack call or an email API request is a ``POST``/``GET`` client span, a child of
the send's or the lookup's span, and carries that span's ``traceparent`` to the server. The
URL on the span is the one fit to show (``events.channels.urls.shown``: no user:password,
no query values): a recipient URL may carry a secret. Off, the transport is not wrapped.
"""

from __future__ import annotations

import httpx
from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransport, RequestInfo
from opentelemetry.trace import Span

from events.channels.urls import shown

# The URL's attribute under the old and the stable HTTP conventions (the instrumentation
# writes one or both, as OTEL_SEMCONV_STABILITY_OPT_IN says).
_URL_ATTRIBUTES = ("http.url", "url.full")


async def _shown_url(span: Span, request: RequestInfo) -> None:
    if not span.is_recording():
        return
    written = getattr(span, "attributes", None) or {}
    for name in _URL_ATTRIBUTES:
        if name in written:
            span.set_attribute(name, shown(str(request.url)))


def traced(transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """``transport`` with a client span per request."""
    return AsyncOpenTelemetryTransport(transport, request_hook=_shown_url)
