"""httpx over aiohttp's connection pool, with every guarantee of the httpcore transport.

httpcore's pool walks every pooled connection (and polls each idle socket) on every
request it queues or releases, so its cost per request grows with the pool: at 64 sends
in flight it spent 2-4 ms of CPU per webhook POST against aiohttp's ~0.45 ms
(bench/http_client.py). This transport keeps httpx's API, exceptions and classification
(``streams/channels/outcomes.py``) and puts aiohttp underneath, guarded the same way:

* **The SSRF guard at connect time.** Names are resolved by ``GuardedResolver``, which
  refuses if ANY address is not allowed and returns only the first, so aiohttp connects
  to the checked address. aiohttp skips the resolver for address literals, so the socket
  factory checks the address of every socket it opens as well: no connection reaches an
  address the policy has not passed.
* **The write guard right before the first byte.** ``_GuardedRequest.send`` is where
  aiohttp starts writing the request on a connection it has acquired; the guard runs
  there, and a refusal closes the connection without a byte written. ``written`` is set
  when the guard allows, so every failure after it counts as "maybe written".
* **Nothing written vs maybe written.** aiohttp's exceptions are mapped by that flag, not
  by their type alone (aiohttp's ``ClientOSError`` is the same type for a refused connect
  and a reset after writing): before it, only ``ConnectError``/``ConnectTimeout``/
  ``PoolTimeout``; after it, only read/write/protocol errors.
* **A pooled connection the server closed** is found before writing (its socket is
  readable while idle, as httpcore checks) and replaced once, nothing written.
* **Timeouts** as httpx's: connect (resolution included), pool wait, read between
  chunks; the hard total deadline stays ``outcomes.request``'s.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import select
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import httpx
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import BaseTimerContext
from aiohttp.http_parser import HttpResponseParserPy

from events.addresses import AddressPolicy, literal_address
from streams.channels.address_guard import BlockedAddress
from streams.channels.write_guard import WriteGuard

# httpcore's message for EOF before any response byte; the classifier matches it.
_DISCONNECTED = "Server disconnected without sending a response."


@dataclass
class _Attempt:
    """What one request's trip through aiohttp needs and leaves behind (per task)."""

    host: str
    guard: WriteGuard | None
    connect_timeout: float | None
    connecting: bool = False
    written: bool = False


_ATTEMPT: contextvars.ContextVar[_Attempt] = contextvars.ContextVar("ledger_http_attempt")


class _StaleConnection(Exception):
    """A pooled connection the server had closed, found before anything was written."""


def _readable(sock: socket.socket | None) -> bool:
    """Whether an idle socket has something to read: for HTTP/1.1, only the server's close."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class GuardedResolver(AbstractResolver):
    """Resolve once, refuse if any address is not allowed, answer only the first."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The first address of ``host``, once every one of them is allowed."""
        attempt = _ATTEMPT.get(None)
        if attempt is not None:
            attempt.connecting = True
        timeout = attempt.connect_timeout if attempt is not None else None
        async with asyncio.timeout(timeout):
            found = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, family=family
            )
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} resolves to no address")
        addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
        for address in addresses:
            if (reason := self._policy.refuses(host, address, port)) is not None:
                raise BlockedAddress(reason)
        first = next(info for info in found if str(info[4][0]) == addresses[0])
        return [
            {
                "hostname": host,
                "host": addresses[0],
                "port": port,
                "family": first[0],
                "proto": first[2],
                "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            }
        ]

    async def close(self) -> None:
        """Nothing to release."""


class _GuardedSockets:
    """aiohttp's socket factory: every socket's address is checked before it connects."""

    def __init__(self, policy: AddressPolicy) -> None:
        self._policy = policy

    def __call__(self, addr_info: Any) -> socket.socket:
        family, type_, proto, _name, address = addr_info
        attempt = _ATTEMPT.get(None)
        if attempt is None:
            # Only this transport's requests carry the host the policy needs.
            raise BlockedAddress("a connection outside a guarded request")
        attempt.connecting = True
        if (reason := self._policy.refuses(attempt.host, str(address[0]), address[1])) is not None:
            raise BlockedAddress(reason)
        return socket.socket(family=family, type=type_, proto=proto)


class _StatusLineHandler(ResponseHandler):
    """aiohttp's connection protocol with its pure-Python response parser.

    aiohttp's C parser (llhttp) fails on the first byte that cannot continue ``HTTP/``;
    h11, under httpcore, waits for the whole status line. A receiver that trickles a
    status line that never completes is therefore a protocol error on one and runs into
    the hard deadline (TIMEOUT_AFTER_WRITE) on the other. The classification tests pin
    the latter, so this transport parses like h11 does (~90 us more per request).
    """

    def set_response_params(
        self,
        *,
        timer: BaseTimerContext | None = None,
        skip_payload: bool = False,
        read_until_eof: bool = False,
        auto_decompress: bool = True,
        read_timeout: float | None = None,
        read_bufsize: int = 2**16,
        timeout_ceil_threshold: float = 5,
        max_line_size: int = 8190,
        max_field_size: int = 8190,
        max_headers: int = 128,
    ) -> None:
        """As aiohttp's, then the same parser settings on the pure-Python parser."""
        super().set_response_params(
            timer=timer,
            skip_payload=skip_payload,
            read_until_eof=read_until_eof,
            auto_decompress=auto_decompress,
            read_timeout=read_timeout,
            read_bufsize=read_bufsize,
            timeout_ceil_threshold=timeout_ceil_threshold,
            max_line_size=max_line_size,
            max_field_size=max_field_size,
            max_headers=max_headers,
        )
        # super() hands bytes the protocol buffered before this response to the parser it
        # built; a healthy HTTP/1.1 connection has none before the request is written (the
        # server speaks only when asked), and bytes still on the socket make it stale.
        self._parser = HttpResponseParserPy(
            self,
            self._loop,
            read_bufsize,
            timer=timer,
            payload_exception=aiohttp.ClientPayloadError,
            response_with_body=not skip_payload,
            read_until_eof=read_until_eof,
            auto_decompress=auto_decompress,
            max_line_size=max_line_size,
            max_field_size=max_field_size,
            max_headers=max_headers,
        )


class _GuardedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector whose connections parse responses like h11."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = cast(
            "functools.partial[ResponseHandler]",
            functools.partial(_StatusLineHandler, loop=self._loop),
        )


class _GuardedRequest(aiohttp.ClientRequest):
    """aiohttp's request, with the write guard run right before it writes the first byte."""

    async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
        """Refuse (closing the connection, nothing written) or mark written, then write."""
        attempt = _ATTEMPT.get(None)
        if attempt is None:
            raise RuntimeError("a guarded request outside GuardedAiohttpTransport")
        transport = conn.transport
        if _readable(transport.get_extra_info("socket") if transport is not None else None):
            raise _StaleConnection
        if attempt.guard is not None:
            attempt.guard.before_first_byte()  # raises SendRefused; aiohttp closes conn
        attempt.written = True
        return await super().send(conn)


class GuardedAiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over one aiohttp session whose connections are guarded."""

    def __init__(
        self, limits: httpx.Limits, policy: AddressPolicy, ssl_context: ssl.SSLContext
    ) -> None:
        self._limits = limits
        self._policy = policy
        self._ssl = ssl_context
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Built on first use: an aiohttp session belongs to the running loop.
        keepalive = self._limits.max_keepalive_connections
        connector = _GuardedConnector(
            limit=self._limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=self._limits.keepalive_expiry,
            force_close=keepalive == 0,
            ssl=self._ssl,
            resolver=GuardedResolver(self._policy),
            # Resolve (and check) for every new connection, as the httpcore transport does.
            use_dns_cache=False,
            socket_factory=_GuardedSockets(self._policy),
        )
        return aiohttp.ClientSession(
            connector=connector,
            request_class=_GuardedRequest,
            cookie_jar=aiohttp.DummyCookieJar(),  # no cookies are kept (http.StatelessClient)
            auto_decompress=False,  # httpx decodes by content-encoding
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through aiohttp; failures as httpx's exceptions, by phase."""
        if self._session is None:
            self._session = self._open()
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        url = _numeric_host(request.url)
        for tries_left in (1, 0):
            attempt = _Attempt(
                host=request.url.host,
                guard=request.extensions.get("write_guard"),
                connect_timeout=timeouts.get("connect"),
            )
            token = _ATTEMPT.set(attempt)
            try:
                response = await self._send(self._session, request, url, body, timeouts, attempt)
            except _StaleConnection:
                if tries_left:
                    continue
                raise httpx.ConnectError(
                    "the server closed the connection before the request was written"
                ) from None
            finally:
                _ATTEMPT.reset(token)
            return httpx.Response(
                status_code=response.status,
                headers=response.raw_headers,
                stream=_ResponseStream(response),
                request=request,
                extensions={
                    "http_version": b"HTTP/1.1",
                    "reason_phrase": (response.reason or "").encode(),
                },
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self,
        session: aiohttp.ClientSession,
        request: httpx.Request,
        url: httpx.URL,
        body: bytes,
        timeouts: dict[str, float | None],
        attempt: _Attempt,
    ) -> aiohttp.ClientResponse:
        pool, connect = timeouts.get("pool"), timeouts.get("connect")
        try:
            return await session.request(
                request.method,
                yarl.URL(str(url), encoded=True),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                compress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    # aiohttp's "connect" covers the pool wait and the connect.
                    connect=None if pool is None or connect is None else pool + connect,
                    sock_connect=connect,
                    sock_read=timeouts.get("read"),
                ),
            )
        except _StaleConnection:
            raise
        except BlockedAddress as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise _mapped(exc, attempt) from exc
        except OSError as exc:
            # aiohttp passes a few socket errors through unwrapped.
            if attempt.written:
                raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        """Close the session and its pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _numeric_host(url: httpx.URL) -> httpx.URL:
    """``url`` with an IPv4 address spelled the way aiohttp accepts (it refuses ``127.1``,
    ``2130706433``, ``0x7f000001``, which httpcore's resolver turns into addresses).

    The Host header keeps the original spelling; the policy still judges the original host
    with the address (the socket factory), as it does on the httpcore transport.
    """
    host = url.host
    if ":" in host or host.endswith("localhost"):
        return url
    address = literal_address(host)
    return url if address is None or address == host else url.copy_with(host=address)


def _mapped(exc: aiohttp.ClientError, attempt: _Attempt) -> httpx.RequestError:
    """The httpx exception for an aiohttp failure, decided by whether the guard let it write."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol(message)
    if not attempt.written:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            if attempt.connecting:
                return httpx.ConnectTimeout(message)
            return httpx.PoolTimeout(message)
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError(_DISCONNECTED)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientOSError | aiohttp.ClientPayloadError):
        return httpx.ReadError(message)
    # A malformed status line or headers, on a connection that carried the request.
    return httpx.RemoteProtocolError(message)


class _ResponseStream(httpx.AsyncByteStream):
    """aiohttp's body as httpx's stream; errors as httpx's read errors."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except aiohttp.ServerTimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "read timeout") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        """Back to the pool if the body was read to its end; else drop the connection."""
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
