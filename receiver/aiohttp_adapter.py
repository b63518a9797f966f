"""The receiver as aiohttp routes / an aiohttp application.

``POST {prefix}`` and ``POST {prefix}/{route}`` receive; ``GET {prefix}/lookup/{key}``
serves the lookup contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from receiver.kit import Reply, WebhookReceiver


def _response(reply: Reply) -> web.Response:
    return web.Response(
        body=reply.json_bytes(),
        status=reply.status,
        headers=reply.headers,
        content_type="application/json",
    )


def routes(receiver: WebhookReceiver, prefix: str = "/hooks") -> list[web.RouteDef]:
    """The receiver's routes under ``prefix``, to add to an existing aiohttp app."""
    prefix = prefix.rstrip("/")

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        route = request.match_info.get("route", "")
        return _response(await receiver.receive(request.headers, body, route))

    async def lookup(request: web.Request) -> web.Response:
        return _response(await receiver.lookup(request.match_info["key"]))

    return [
        web.get(f"{prefix}/lookup/{{key}}", lookup),
        web.post(prefix or "/", receive),
        web.post(f"{prefix}/{{route:.+}}", receive),
    ]


def aiohttp_app(receiver: WebhookReceiver, prefix: str = "/hooks") -> web.Application:
    """An aiohttp app serving only the receiver; it starts and closes the store itself."""

    async def store_lifecycle(_app: web.Application) -> AsyncIterator[None]:
        await receiver.start()
        yield
        await receiver.close()

    app = web.Application()
    app.add_routes(routes(receiver, prefix))
    app.cleanup_ctx.append(store_lifecycle)
    return app
