"""The receiver as aiohttp routes / an aiohttp application, and a way to serve it.

``POST {prefix}`` and ``POST {prefix}/{route}`` receive; ``GET {prefix}/lookup/{key}``
serves the lookup contract. A body over ``max_body_bytes`` is refused 413 by aiohttp while
it arrives (``client_max_size``). Serve with ``run_app`` or ``app_runner``: they close a
connection that has not sent a whole request head within ``header_timeout_s``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from receiver.kit import HEADER_TIMEOUT_S, MAX_BODY_BYTES, Reply, WebhookReceiver


def _response(reply: Reply) -> web.Response:
    return web.Response(
        body=reply.json_bytes(),
        status=reply.status,
        headers=reply.headers,
        content_type="application/json",
    )


def routes(receiver: WebhookReceiver, prefix: str = "/hooks") -> list[web.RouteDef]:
    """The receiver's routes under ``prefix``, to add to an existing aiohttp app (whose
    ``client_max_size`` bounds the body)."""
    prefix = prefix.rstrip("/")

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        route = request.match_info.get("route", "")
        return _response(await receiver.receive(request.headers, body, route))

    async def lookup(request: web.Request) -> web.Response:
        return _response(await receiver.lookup(request.match_info["key"], request.headers))

    return [
        web.get(f"{prefix}/lookup/{{key}}", lookup),
        web.post(prefix or "/", receive),
        web.post(f"{prefix}/{{route:.+}}", receive),
    ]


def aiohttp_app(
    receiver: WebhookReceiver, prefix: str = "/hooks", *, max_body_bytes: int = MAX_BODY_BYTES
) -> web.Application:
    """An aiohttp app serving only the receiver; it starts and closes the store itself."""

    async def store_lifecycle(_app: web.Application) -> AsyncIterator[None]:
        await receiver.start()
        yield
        await receiver.close()

    app = web.Application(client_max_size=max_body_bytes)
    app.add_routes(routes(receiver, prefix))
    app.cleanup_ctx.append(store_lifecycle)
    return app


def app_runner(
    app: web.Application, *, header_timeout_s: float = HEADER_TIMEOUT_S
) -> web.AppRunner:
    """An ``AppRunner`` for ``app`` that closes slow-header connections.

    aiohttp (3.14, as tested) arms its keep-alive timer when a connection opens and again after
    each answer, and on expiry closes the connection if no complete request head has
    arrived, however many header bytes trickled in: as a keep-alive timeout, it is a
    header read timeout (tests/receiver/test_header_timeout.py holds it to that).
    """
    return web.AppRunner(app, keepalive_timeout=header_timeout_s)


def run_app(
    app: web.Application,
    *,
    host: str,
    port: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
) -> None:
    """Serve ``app`` until interrupted (``web.run_app`` with the header read timeout)."""
    web.run_app(app, host=host, port=port, keepalive_timeout=header_timeout_s)
