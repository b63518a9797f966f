"""The one pooled httpx client a worker shares across every channel and every send.

Its pool is aiohttp's (``aiohttp_transport.py``) or httpcore's (``LEDGER_CHANNELS__HTTP_POOL``);
both connect only to addresses the SSRF policy allows and run the write guard right
before the first byte, so a failure classifies the same way on either.
"""

from __future__ import annotations

from typing import Any

import httpcore
import httpx

from clients import tracing
from config.parts import ChannelSettings
from config.settings import address_policy
from events.addresses import AddressPolicy
from streams.channels.address_guard import GuardedBackend
from streams.channels.aiohttp_transport import GuardedAiohttpTransport
from streams.channels.traced_transport import traced

USER_AGENT = "delivery-ledger/0.1"


def create_http_client(settings: ChannelSettings) -> httpx.AsyncClient:
    """Build the worker's shared AsyncClient: pool sized by ``send_concurrency``, our timeouts.

    Create it once per worker and close it (``await client.aclose()``) on shutdown.
    """
    timeout = httpx.Timeout(
        settings.http_timeout_s,
        connect=settings.http_connect_timeout_s,
        # Waiting for a free pooled connection writes nothing, so it is a safe failure;
        # bound it like any other wait.
        pool=settings.http_timeout_s,
    )
    limits = httpx.Limits(
        max_connections=settings.send_concurrency,
        max_keepalive_connections=settings.send_concurrency,
        # Shorter than common server idle timeouts (Node's is 5 s): reusing a connection the
        # server is closing turns a clean send into "reset after write", i.e. an UNKNOWN.
        keepalive_expiry=2.0,
    )
    policy = address_policy(settings)
    transport: httpx.AsyncBaseTransport
    if settings.http_pool == "aiohttp":
        ssl_context = httpx.create_ssl_context(trust_env=False)
        transport = GuardedAiohttpTransport(limits, policy, ssl_context)
    else:
        transport = _GuardedTransport(limits, policy)
    if tracing.enabled():
        transport = traced(transport)
    return StatelessClient(
        timeout=timeout,
        transport=transport,
        # No proxies from the environment: "connection refused, nothing left" is only
        # true when we connect to the receiver itself, not to a proxy in between.
        trust_env=False,
        # A signed POST is never replayed to another URL behind our back.
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
    )


class _NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing."""

    def extract_cookies(self, response: httpx.Response) -> None:
        """A receiver's Set-Cookie is not kept."""


class StatelessClient(httpx.AsyncClient):
    """An AsyncClient that keeps no cookies: every delivery is the same request whatever a
    receiver answered before, and httpx's cookie extraction (a urllib request built per
    response) was ~2.5% of a worker's CPU in a backlog drain."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._jar = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        """Always empty."""
        return self._jar

    @cookies.setter
    def cookies(self, _cookies: object) -> None:
        pass  # none are kept


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over a pool whose sockets go only to checked addresses."""

    def __init__(self, limits: httpx.Limits, policy: AddressPolicy) -> None:
        super().__init__(limits=limits, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(policy),
        )
