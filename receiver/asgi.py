"""The receiver as Starlette routes / an ASGI app (mount it in FastAPI or any ASGI server).

``POST {prefix}`` and ``POST {prefix}/{route}`` receive; ``GET {prefix}/lookup/{key}``
serves the lookup contract. Needs ``starlette`` (``delivery-ledger[receiver]``).
A body is read only up to ``max_body_bytes``: past it (declared or as it streams in) the
answer is 413 and the rest is never read, so an unsigned huge POST costs no memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from receiver.kit import MAX_BODY_BYTES, Reply, WebhookReceiver


def _response(reply: Reply) -> Response:
    return Response(reply.json_bytes(), reply.status, reply.headers, media_type="application/json")


def _too_large(limit: int) -> Response:
    # Close: the unread rest of the body must not be parsed as the next request.
    headers = {"connection": "close"}
    return _response(Reply(413, {"error": f"the body is larger than {limit} bytes"}, headers))


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to be over ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def routes(
    receiver: WebhookReceiver, prefix: str = "/hooks", *, max_body_bytes: int = MAX_BODY_BYTES
) -> list[BaseRoute]:
    """The receiver's routes under ``prefix``, to add to an existing Starlette/FastAPI app."""
    prefix = prefix.rstrip("/")

    async def receive(request: Request) -> Response:
        body = await _bounded_body(request, max_body_bytes)
        if body is None:
            return _too_large(max_body_bytes)
        reply = await receiver.receive(request.headers, body, request.path_params.get("route", ""))
        return _response(reply)

    async def lookup(request: Request) -> Response:
        return _response(await receiver.lookup(request.path_params["key"], request.headers))

    return [
        Route(f"{prefix}/lookup/{{key}}", lookup, methods=["GET"]),
        Route(prefix or "/", receive, methods=["POST"]),
        Route(f"{prefix}/{{route:path}}", receive, methods=["POST"]),
    ]


def asgi_app(
    receiver: WebhookReceiver, prefix: str = "/hooks", *, max_body_bytes: int = MAX_BODY_BYTES
) -> Starlette:
    """A Starlette app serving only the receiver; it starts and closes the store itself."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await receiver.start()
        try:
            yield
        finally:
            await receiver.close()

    return Starlette(
        routes=routes(receiver, prefix, max_body_bytes=max_body_bytes), lifespan=lifespan
    )
