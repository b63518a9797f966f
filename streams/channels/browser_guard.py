"""The browser channel's address guard: Chromium connects only through a SOCKS5 proxy on
127.0.0.1 that resolves, checks and connects as the HTTP guard does.

Why a proxy and not request interception (CDP ``Fetch``, Playwright's routes): interception
sees requests, not connections. Playwright routes a redirect's first URL only and not
WebSockets, and Chromium resolves a name again after any check made outside it, so a DNS
answer that changes in between (rebinding) would go unseen. Chromium hands every connection
— navigations, each redirect hop, subresources, fetch/XHR, WebSockets, http and https — to
a SOCKS5 proxy with the host NAME (SOCKS5 resolves remotely), so the proxy decides with the
HTTP guard's own ``checked_address`` (every address the name resolves to is checked against
the same ``AddressPolicy`` and allow-lists) and connects to the checked address. TLS stays
end to end (Chromium verifies the certificate for the name).

The launch makes it the only way out (``LAUNCH_ARGS``): loopback is proxied too
(``<-loopback>``), Chromium's own resolver maps every name to nothing, and WebRTC may not
use UDP that is not proxied (SOCKS5 here carries TCP only). Each attempt has a listener of
its own (``watch``), so the refusals in its evidence are its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import struct
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpcore

from events.addresses import AddressPolicy
from events.ports import free_port
from streams.channels.address_guard import BlockedAddress, checked_address

if TYPE_CHECKING:
    from playwright.async_api import ProxySettings

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
HANDSHAKE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 3.0
BUFFER = 65536
MAX_REFUSALS = 20
# SOCKS5 (RFC 1928): version, "no authentication", CONNECT, the address types, replies.
VERSION, NO_AUTH, NO_METHOD, CONNECT = 5, 0, 0xFF, 1
IPV4, DOMAIN, IPV6 = 1, 3, 4
OK, FAILURE, NOT_ALLOWED, UNREACHABLE, REFUSED, NO_COMMAND, NO_TYPE = 0, 1, 2, 4, 5, 7, 8


# With the launch's proxy (``proxy_settings``), these leave Chromium no other way out.
LAUNCH_ARGS = (
    f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {HOST}",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--disable-quic",
)


def proxy_settings(url: str) -> ProxySettings:
    """Playwright's proxy option for the guard at ``url``, loopback proxied too (Chromium
    would otherwise connect to loopback addresses directly)."""
    return {"server": url, "bypass": "<-loopback>"}


class Refused(Exception):
    """A SOCKS request this proxy will not carry: the reply code and why."""

    def __init__(self, reply: int, reason: str) -> None:
        super().__init__(reason)
        self.reply = reply
        self.reason = reason


class GuardListener:
    """One SOCKS5 listener on 127.0.0.1 behind the policy; what it refused, in order."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.BaseTransport] = set()
        self.refusals: list[str] = []
        self.refused_at: set[tuple[str, int]] = set()  # (host as the browser named it, port)
        self.url = ""

    async def start(self) -> GuardListener:
        """Listen on a free port of 127.0.0.1 (outside the ephemeral range)."""
        for _ in range(5):  # another process may take the free port before the bind
            port = free_port(HOST)
            try:
                self._server = await asyncio.start_server(self._accept, HOST, port)
            except OSError:
                continue
            self.url = f"socks5://{HOST}:{port}"
            return self
        raise OSError(f"the browser's address guard found no free port on {HOST}")

    def proxy(self) -> ProxySettings:
        """This listener as Playwright's proxy option for a browser context."""
        return proxy_settings(self.url)

    async def aclose(self) -> None:
        """Stop listening and cut the connections it carries."""
        if self._server is not None:
            self._server.close()
        # Cut the sockets rather than cancel the tasks: each copy then ends at its end of
        # stream, and the connection's task returns as it always does.
        for transport in list(self._transports):
            transport.abort()  # type: ignore[attr-defined]
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), CLOSE_TIMEOUT_S)
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._transports.add(writer.transport)
        try:
            await self._carry(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            pass  # the browser went away, or spoke no SOCKS5 (in time)
        finally:
            self._tasks.discard(task)
            self._transports.discard(writer.transport)
            writer.transport.abort()

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            host, port = await _handshake(reader, writer)
            try:
                upstream = await self._connect(host, port)
            except Refused as exc:
                if exc.reply == NOT_ALLOWED and len(self.refusals) < MAX_REFUSALS:
                    self.refusals.append(exc.reason)
                    self.refused_at.add((host.lower(), port))
                log.info("browser address guard: %s:%d: %s", host, port, exc.reason)
                writer.write(_reply(exc.reply))
                await writer.drain()
                return
            writer.write(_reply(OK))
            await writer.drain()
        up_reader, up_writer = upstream
        self._transports.add(up_writer.transport)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._transports.discard(up_writer.transport)
            up_writer.transport.abort()

    async def _connect(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            address = await checked_address(self._policy, host, port, CONNECT_TIMEOUT_S)
        except BlockedAddress as exc:
            raise Refused(NOT_ALLOWED, f"refused by the address policy: {exc.reason}") from None
        except httpcore.ConnectError as exc:
            raise Refused(UNREACHABLE, str(exc)) from None
        except httpcore.ConnectTimeout as exc:
            raise Refused(UNREACHABLE, str(exc)) from None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(address, port)
        except ConnectionRefusedError:
            raise Refused(REFUSED, f"{host}:{port} refused the connection") from None
        except (OSError, TimeoutError) as exc:
            raise Refused(UNREACHABLE, f"{host}:{port}: {exc or type(exc).__name__}") from None


class BrowserGuard:
    """The browser's listener (the launch's proxy: whatever no attempt owns) and one
    listener per attempt (``watch``), all behind one policy."""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy
        self._main: GuardListener | None = None

    async def start(self) -> str:
        """Start the browser's listener; its proxy URL for the launch."""
        if self._main is None:
            self._main = await GuardListener(self.policy).start()
        return self._main.url

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[GuardListener]:
        """A listener for one attempt's browser context (``listener.proxy()``)."""
        listener = await GuardListener(self.policy).start()
        try:
            yield listener
        finally:
            await listener.aclose()

    async def aclose(self) -> None:
        """Stop the browser's listener."""
        if self._main is not None:
            await self._main.aclose()
            self._main = None


async def _handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, int]:
    """The SOCKS5 greeting and CONNECT request: the host (a name or an address) and port."""
    version, count = await reader.readexactly(2)
    methods = await reader.readexactly(count)
    if version != VERSION or NO_AUTH not in methods:
        writer.write(bytes([VERSION, NO_METHOD]))
        raise OSError("not a SOCKS5 client without authentication")
    writer.write(bytes([VERSION, NO_AUTH]))
    version, command, _, kind = await reader.readexactly(4)
    if kind == IPV4:
        host = str(ipaddress.IPv4Address(await reader.readexactly(4)))
    elif kind == IPV6:
        host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
    elif kind == DOMAIN:
        (length,) = await reader.readexactly(1)
        host = (await reader.readexactly(length)).decode("ascii", errors="replace")
    else:
        writer.write(_reply(NO_TYPE))
        raise OSError(f"SOCKS5 address type {kind}")
    (port,) = struct.unpack(">H", await reader.readexactly(2))
    if version != VERSION or command != CONNECT:
        writer.write(_reply(NO_COMMAND))
        raise OSError(f"SOCKS5 command {command}: only CONNECT")
    return host, port


def _reply(code: int) -> bytes:
    return bytes([VERSION, code, 0, IPV4, 0, 0, 0, 0, 0, 0])


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close; a reset ends both directions abruptly."""
    try:
        while data := await reader.read(BUFFER):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.transport.abort()
