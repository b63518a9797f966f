"""Serving the API with uvicorn until told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import uvicorn

from api.app import create_app
from api.services import Services
from config.settings import Settings
from events.ports import listen_port


class _Server(uvicorn.Server):
    """uvicorn's server, leaving signals to the caller (who sets ``stop``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listening_socket(host: str, port: int) -> socket.socket:
    """The API's socket, bound (port 0: a free one below the kernel's ephemeral range,
    events/ports.py). Made with proto=IPPROTO_TCP, as asyncio's own servers make theirs:
    asyncio sets TCP_NODELAY on accepted connections only when the socket says it is TCP,
    and without it every keep-alive answer written in two parts (uvicorn: headers, then
    body) waited out the client's delayed ACK (~40 ms)."""
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, listen_port(port, host)))
    return sock


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
    sock = listening_socket(settings.api.host, settings.api.port)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=10
    )
    server = _Server(config)
    try:
        await held.start()  # a broker that does not answer: LedgerError, one line
    except BaseException:
        await held.stop()
        sock.close()
        raise
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task  # raises what stopped it
                return 0, 0
            await asyncio.sleep(0.05)
        port = sock.getsockname()[1]
        host = settings.api.host
        if ready is not None:
            ready(f"http://{f'[{host}]' if ':' in host else host}:{port}")
        await stop.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
        await held.stop()
    return held.publisher.runs_committed, held.publisher.transactions_committed
