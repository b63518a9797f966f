"""Serving the ASGI app with uvicorn, with a header read timeout uvicorn does not have.

uvicorn starts no timer when a connection opens, and its keep-alive timer is cancelled by
the first byte of the next request: a client that trickles a header line every few
seconds holds a connection for ever. ``HeaderTimeoutH11Protocol`` closes a connection
whose request head is not complete ``header_timeout_s`` after the connection opened or
the previous answer was sent. It is the one place that relies on uvicorn's h11 protocol
internals (``cycle``, ``on_response_complete``); tests/receiver/test_header_timeout.py
checks the behaviour on the uvicorn installed. Needs ``uvicorn``.

``serve_on`` serves an app on a socket already bound (``events.ports.listening_socket``)
until an event is set: the one way the ledger's own servers (``ledger api``, ``ledger
dashboard``) run uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from receiver.kit import HEADER_TIMEOUT_S

# How long a stopping server waits for the answers in progress.
GRACEFUL_S = 10
STARTING_TRIES = 600


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing connections that do not finish a request head in time."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    _head_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the clock for the first request head."""
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """Stop the clock once a new request head has been parsed (a new cycle began)."""
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:
            self._disarm()

    def on_response_complete(self) -> None:
        """Start the clock for the next request head, unless one is already in."""
        before = self.cycle
        super().on_response_complete()
        if self.cycle is before and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """No clock for a closed connection."""
        self._disarm()
        super().connection_lost(exc)


def uvicorn_config(
    app: Any,
    *,
    host: str,
    port: int,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    **options: Any,
) -> uvicorn.Config:
    """A ``uvicorn.Config`` serving ``app`` over h11 with the header read timeout."""
    protocol = header_timeout_protocol(header_timeout_s)
    return uvicorn.Config(app, host=host, port=port, http=protocol, **options)


def header_timeout_protocol(header_timeout_s: float = HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """``HeaderTimeoutH11Protocol`` closing connections after ``header_timeout_s``."""
    return type(
        "HeaderTimeoutH11Protocol",
        (HeaderTimeoutH11Protocol,),
        {"header_timeout_s": header_timeout_s},
    )


class _Server(uvicorn.Server):
    """uvicorn's server, leaving signals to the caller (who sets ``stop``)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_on(
    app: Any,
    sock: socket.socket,
    stop: asyncio.Event,
    *,
    ready: Callable[[int], None] | None = None,
    **options: Any,
) -> None:
    """Serve ``app`` on the bound ``sock`` until ``stop`` is set, then close it; ``ready``
    gets the port once it listens. ``options`` are ``uvicorn.Config``'s (``http``,
    ``lifespan``...); no access log, warnings only, signals left to the caller."""
    settings: dict[str, Any] = {
        "log_level": "warning",
        "access_log": False,
        "lifespan": "off",
        "timeout_graceful_shutdown": GRACEFUL_S,
    }
    server = _Server(uvicorn.Config(app, **{**settings, **options}))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(STARTING_TRIES):  # bounded: uvicorn starts in well under a second
            if server.started or task.done():
                break
            await asyncio.sleep(0.05)
        if task.done():
            await task  # raises what stopped it, if anything did
            return
        if not server.started:
            raise TimeoutError(f"uvicorn did not start within {STARTING_TRIES * 0.05:.0f} s")
        if ready is not None:
            ready(sock.getsockname()[1])
        await stop.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
