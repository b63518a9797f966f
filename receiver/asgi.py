"""The receiver as Starlette routes / an ASGI app (mount it in FastAPI or any ASGI server).

``POST {prefix}`` and ``POST {prefix}/{route}`` receive; ``GET {prefix}/lookup/{key}``
serves the lookup contract. Needs ``starlette`` (``delivery-ledger[receiver]``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from receiver.kit import Reply, WebhookReceiver


def _response(reply: Reply) -> Response:
    return Response(reply.json_bytes(), reply.status, reply.headers, media_type="application/json")


def routes(receiver: WebhookReceiver, prefix: str = "/hooks") -> list[BaseRoute]:
    """The receiver's routes under ``prefix``, to add to an existing Starlette/FastAPI app."""
    prefix = prefix.rstrip("/")

    async def receive(request: Request) -> Response:
        body = await request.body()
        reply = await receiver.receive(request.headers, body, request.path_params.get("route", ""))
        return _response(reply)

    async def lookup(request: Request) -> Response:
        return _response(await receiver.lookup(request.path_params["key"]))

    return [
        Route(f"{prefix}/lookup/{{key}}", lookup, methods=["GET"]),
        Route(prefix or "/", receive, methods=["POST"]),
        Route(f"{prefix}/{{route:path}}", receive, methods=["POST"]),
    ]


def asgi_app(receiver: WebhookReceiver, prefix: str = "/hooks") -> Starlette:
    """A Starlette app serving only the receiver; it starts and closes the store itself."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await receiver.start()
        try:
            yield
        finally:
            await receiver.close()

    return Starlette(routes=routes(receiver, prefix), lifespan=lifespan)
