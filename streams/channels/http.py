"""The one pooled httpx client a worker shares across every channel and every send."""

from __future__ import annotations

import importlib.util
import sys

import httpx

from events.settings import Settings

USER_AGENT = "delivery-ledger/0.1"


def _skip_sniffio_probe() -> None:
    # httpcore runs ``import sniffio`` on every request (and again when a response closes)
    # to learn which async library is running. sniffio is optional and anyio no longer
    # pulls it in; without it each of those imports fails only after walking sys.path:
    # ~4% of a worker's CPU at saturation (py-spy, bench/profile_worker.py). A None entry
    # in sys.modules makes the failing import immediate; httpcore's answer ("asyncio")
    # is the same either way.
    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


def create_http_client(settings: Settings) -> httpx.AsyncClient:
    """Build the worker's shared AsyncClient: pool sized by ``send_concurrency``, our timeouts.

    Create it once per worker and close it (``await client.aclose()``) on shutdown.
    """
    _skip_sniffio_probe()
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
