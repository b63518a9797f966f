"""Serving the ASGI app with uvicorn, with a header read timeout uvicorn does not have.

uvicorn starts no timer when a connection opens, and its keep-alive timer is cancelled by
the first byte of the next request: a client that trickles a header line every few
seconds holds a connection for ever. ``HeaderTimeoutH11Protocol`` closes a connection
whose request head is not complete ``header_timeout_s`` after the connection opened or
the previous answer was sent. It is the one place that relies on uvicorn's h11 protocol
internals (``cycle``, ``on_response_complete``); tests/receiver/test_header_timeout.py
checks the behaviour on the uvicorn installed. Needs ``uvicorn``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from receiver.kit import HEADER_TIMEOUT_S


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
    protocol = type(
        "HeaderTimeoutH11Protocol",
        (HeaderTimeoutH11Protocol,),
        {"header_timeout_s": header_timeout_s},
    )
    return uvicorn.Config(app, host=host, port=port, http=protocol, **options)
