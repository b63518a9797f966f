"""The SSRF guard at the socket: resolve once, check every address, connect to the checked one.

httpcore asks its network backend for a TCP connection to (host, port). This backend
resolves the name itself, refuses the connection if ANY address it resolves to is not
allowed (``events/addresses.py``), and connects to the checked address, so no second
resolution can point the socket elsewhere (DNS rebinding). TLS still verifies and sends
SNI for the original host name, and the request keeps its Host header: httpcore passes
the origin's host to ``start_tls`` and writes the request, not this backend.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any

import httpcore

from events.addresses import AddressPolicy


class BlockedAddress(httpcore.ConnectError):
    """The recipient's name resolves to an address that may not be contacted (a connect
    error to httpx, that the classifier tells apart by this type in the cause chain)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"blocked: {reason}")
        self.reason = reason


async def checked_address(
    policy: AddressPolicy,
    host: str,
    port: int,
    timeout: float | None,  # noqa: ASYNC109 - a bound on the resolution alone
) -> str:
    """Resolve ``host`` once and return its first address, once every address it resolves
    to is allowed on ``port``: connect to that address, never to the name again.

    Raises ``BlockedAddress`` (a refused address), ``httpcore.ConnectTimeout`` or
    ``httpcore.ConnectError`` (no answer, no such name). The HTTP guard and the browser's
    (``streams/channels/browser_guard.py``) both decide here.
    """
    try:
        async with asyncio.timeout(timeout):
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
    except TimeoutError:
        raise httpcore.ConnectTimeout(f"resolving {host} took over {timeout}s") from None
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not addresses:
        raise httpcore.ConnectError(f"{host} resolves to no address")
    for address in addresses:
        if (reason := policy.refuses(host, address, port)) is not None:
            raise BlockedAddress(reason)
    return addresses[0]


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's default backend, behind the address policy."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Connect to the first address of ``host``, once every one of them is allowed."""
        address = await checked_address(self._policy, host, port, timeout)
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Never: a delivery goes over TCP to a checked address."""
        raise httpcore.ConnectError("unix sockets are not a delivery target")

    async def sleep(self, seconds: float) -> None:
        """As httpcore's default backend."""
        await self._inner.sleep(seconds)
