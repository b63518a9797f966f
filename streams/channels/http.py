"""The one pooled httpx client a worker shares across every channel and every send."""

from __future__ import annotations

import httpx

from events.settings import Settings

USER_AGENT = "delivery-ledger/0.1"


def create_http_client(settings: Settings) -> httpx.AsyncClient:
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
    return httpx.AsyncClient(
        timeout=timeout,
        limits=limits,
        # No proxies from the environment: "connection refused, nothing left" is only
        # true when we connect to the receiver itself, not to a proxy in between.
        trust_env=False,
        # A signed POST is never replayed to another URL behind our back.
        follow_redirects=False,
        headers={"user-agent": USER_AGENT},
    )
