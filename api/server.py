"""Serving the API with uvicorn until told to stop (``receiver.uvicorn_server.serve_on``,
as the dashboard; httptools, uvicorn's C parser, when installed: less CPU per request)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from api.app import create_app
from api.services import Services
from config.settings import Settings
from events.ports import base_url, listening_socket
from receiver.uvicorn_server import serve_on


async def serve(
    settings: Settings,
    stop: asyncio.Event,
    *,
    ready: Callable[[str], None] | None = None,
) -> tuple[int, int]:
    """Serve on ``settings.api.host``/``port`` until ``stop`` is set; ``ready`` gets the
    base URL once it listens (port 0: the one it got). Returns the runs (and run events)
    committed and the Kafka transactions that carried them (group commit's batching)."""
    held = Services.of(settings, lambda: datetime.now(UTC))
    app = create_app(settings, services=held)
    host = settings.api.host
    sock = listening_socket(host, settings.api.port)
    try:
        await held.start()  # a broker that does not answer: LedgerError, one line
    except BaseException:
        await held.stop()
        sock.close()
        raise
    try:
        await serve_on(
            app,
            sock,
            stop,
            ready=None if ready is None else lambda port: ready(base_url(host, port)),
        )
    finally:
        await held.stop()
    return held.publisher.runs_committed, held.publisher.transactions_committed
