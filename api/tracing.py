"""A span per API request (clients/tracing.py says when tracing is on).

The request's own ``traceparent``, if the agent sent one, is the parent: a run published
over HTTP continues the agent's trace through ``ledger.publish`` (a child of this span) to
the worker and the receiver. Off, the API's no-op tracer makes this a few microseconds.
"""

from __future__ import annotations

from opentelemetry.trace import SpanKind
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clients.tracing import TRACEPARENT, checked_traceparent, span


class RequestSpans:
    """ASGI middleware: each HTTP request is a server span ``ledger.api METHOD ROUTE``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        parent = None
        for name, value in scope.get("headers", []):
            if name == TRACEPARENT.encode():
                parent = checked_traceparent(value.decode("latin-1"))
                break
        method = scope.get("method", "")
        attributes = {"http.request.method": method, "url.path": scope.get("path", "")}
        name = f"ledger.api {method}"
        with span(name, attributes, parent=parent, kind=SpanKind.SERVER) as opened:

            async def status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    opened.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, status)
            route = scope.get("route")
            if (template := getattr(route, "path", None)) is not None:
                opened.update_name(f"ledger.api {method} {template}")
                opened.set_attribute("http.route", template)
