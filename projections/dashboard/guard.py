"""Who may ask the dashboard: the Host a request names, its bearer token, the binding.

A page on ``attacker.example`` whose name is re-pointed at 127.0.0.1 (DNS rebinding)
reaches a loopback dashboard from the victim's browser, same-origin as far as the
browser knows; only the ``Host`` header gives it away. So every request must name the
bound address, a loopback name when bound to loopback, or a configured name
(``LEDGER_DASHBOARD__ALLOWED_HOSTS``). An IP literal cannot be re-pointed, so when the
dashboard listens on every interface any address is accepted.

``Guard`` is the ASGI middleware that asks all of it before any route runs (a request that
matches no route, a CORS preflight, included), and puts the security headers on every
answer.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from config.parts import DashboardSettings
from events.addresses import is_loopback
from events.errors import LedgerError
from projections.dashboard.errors import Refused

MIN_TOKEN_BYTES = 32
# Longer than this is not a token we issued: refused without comparing.
MAX_TOKEN_BYTES = 1024
# A header line longer than this is refused before anything reads it (aiohttp's parser
# limit, which the dashboard had; h11 limits only a head that arrives incomplete).
MAX_HEADER_BYTES = 8190
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names, not a binding
_PLACEHOLDER = re.compile(r"change[\s_-]*me|changeit|replace[\s_-]*me", re.IGNORECASE)
_TOKEN_HINT = "generate one: python -c 'import secrets; print(secrets.token_urlsafe(32))'"  # noqa: S105
_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]]+))(?::(?P<port>\d{1,5}))?$")


def check_binding(settings: DashboardSettings) -> None:
    """Refuse (``LedgerError``) to listen beyond loopback without a bearer token, and any
    token that is short or a placeholder (the value is never repeated)."""
    token = settings.token.get_secret_value() if settings.token else ""
    if not is_loopback(settings.host) and not token:
        raise LedgerError(
            f"refusing to serve the dashboard on {settings.host} (not loopback) "
            "without a bearer token",
            "set LEDGER_DASHBOARD__TOKEN, or bind to 127.0.0.1 with LEDGER_DASHBOARD__HOST",
        )
    if not token:
        return
    size = len(token.encode("utf-8", "surrogateescape"))
    if size < MIN_TOKEN_BYTES:
        raise LedgerError(
            f"LEDGER_DASHBOARD__TOKEN is {size} bytes; it must be at least {MIN_TOKEN_BYTES}",
            _TOKEN_HINT,
        )
    if size > MAX_TOKEN_BYTES:
        raise LedgerError(
            f"LEDGER_DASHBOARD__TOKEN is {size} bytes; it must be at most {MAX_TOKEN_BYTES}",
            _TOKEN_HINT,
        )
    if _PLACEHOLDER.search(token) or len(set(token)) < 8:
        raise LedgerError(
            "LEDGER_DASHBOARD__TOKEN looks like a placeholder, not a random token", _TOKEN_HINT
        )


def allowed_hosts(settings: DashboardSettings) -> frozenset[str]:
    """The host names (lowercase, IPv6 without brackets) a request may name in ``Host``."""
    names = {_normal(settings.host)}
    if is_loopback(settings.host):
        names |= LOOPBACK_NAMES
    names |= {_normal(name) for name in settings.allowed_hosts}
    return frozenset(names - WILDCARDS)


def host_allowed(header: str | None, settings: DashboardSettings, allowed: frozenset[str]) -> bool:
    """Whether a ``Host`` header (with or without port) names this dashboard."""
    match = _HOST.match(header or "")
    if match is None or int(match["port"] or 80) > 65535:
        return False
    host = _normal(match["v6"] or match["name"])
    if host in allowed:
        return True
    # Bound to every interface: clients reach it by any address, and an address (unlike
    # a name) cannot be re-pointed by DNS.
    return _normal(settings.host) in WILDCARDS and _is_address(host)


def authorized(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``; never raises.

    Compared as bytes in constant time: a header with non-ASCII characters is just wrong.
    """
    scheme, _, given = (header or "").strip().partition(" ")
    offered = given.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not offered or len(offered) > MAX_TOKEN_BYTES:
        return False
    return hmac.compare_digest(offered, token.encode("utf-8", "surrogateescape"))


def unauthorized() -> Response:
    """401 with a challenge and no data."""
    # The challenge (WWW-Authenticate) says what to send; the body is only the line.
    return Refused(
        401,
        "bearer token required",
        headers={"WWW-Authenticate": 'Bearer realm="ledger-dashboard"'},
    ).response()


def misdirected() -> Response:
    """421 with a short body and no data: the request named a host that is not this one."""
    return PlainTextResponse(
        "unknown Host; the dashboard answers only to its own names "
        "(LEDGER_DASHBOARD__ALLOWED_HOSTS adds one)\n",
        421,
    )


# Methods that change nothing. Any other (POST, and a CORS preflight's OPTIONS) must come
# from the dashboard's own page and carry the token.
SAFE_METHODS = frozenset({"GET", "HEAD"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def cross_site(headers: Mapping[str, str], host: str | None) -> str | None:
    """Why a state-changing request is not from the dashboard's own page (None: it is).

    The browser says where a request comes from: ``Origin`` (sent with every POST and
    preflight), else ``Sec-Fetch-Site``, else the ``Referer``. The origin must name the
    host and port the request was sent to (``Host``, already checked): a page on any other
    origin, a sandboxed frame (``Origin: null``) or a client that says nothing is refused.
    """
    origin = headers.get("Origin")
    if origin is not None:
        return (
            None if _same_place(origin, host) else f"Origin {origin[:200]!r} is not this dashboard"
        )
    site = headers.get("Sec-Fetch-Site")
    if site is not None:
        return None if site == "same-origin" else f"Sec-Fetch-Site is {site[:40]!r}"
    referer = headers.get("Referer")
    if referer is not None:
        return None if _same_place(referer, host) else "the Referer is not this dashboard"
    return "the request says nothing of where it comes from (no Origin, Sec-Fetch-Site, Referer)"


def _same_place(url: str, host: str | None) -> bool:
    """Whether ``url``'s scheme, host and port are those of a request sent to ``host``.

    The port a ``Host`` without one means is the origin's scheme's default: behind a TLS
    proxy, ``https://ledger.example`` and ``Host: ledger.example`` are the same place."""
    own = _HOST.match(host or "")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    if own is None or parts.scheme not in _DEFAULT_PORTS or parts.hostname is None:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    own_port = int(own["port"]) if own["port"] else default
    return _normal(parts.hostname) == _normal(own["v6"] or own["name"]) and (
        (port or default) == own_port
    )


def refused(reason: str, hint: str) -> Response:
    """403 with one line and a hint, and no data."""
    return Refused(403, reason, hint).response()


# Data lives behind /api and /metrics; the page shell and its assets hold none.
PROTECTED = ("/api/", "/metrics")
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Guard:
    """Every request passes here first: its Host, where a state-changing one comes from,
    its token; every answer leaves with ``SECURITY_HEADERS``."""

    def __init__(self, app: ASGIApp, settings: DashboardSettings) -> None:
        self.app = app
        self.settings = settings
        self.hosts = allowed_hosts(settings)
        self.token = settings.token.get_secret_value() if settings.token else ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or pass the request on; either way with the security headers."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        if any(len(name) + len(value) + 2 > MAX_HEADER_BYTES for name, value in scope["headers"]):
            refusal: Response | None = Refused(
                400,
                f"a request header is over {MAX_HEADER_BYTES} bytes",
                "send the header the dashboard asks for, no more",
            ).response()
        else:
            refusal = self.refusal(scope["method"], scope["path"], Headers(scope=scope))
        if refusal is not None:
            await refusal(scope, receive, secured)
            return
        await self.app(scope, receive, secured)

    def refusal(self, method: str, path: str, headers: Headers) -> Response | None:
        """Why this request gets no answer from a route (None: it may have one)."""
        # The Host first: a rebound name learns nothing, not even whether a token is needed.
        host = headers.get("Host")
        if not host_allowed(host, self.settings, self.hosts):
            return misdirected()
        changes = method not in SAFE_METHODS
        # A request that changes something comes from the dashboard's own page, whatever
        # it carries: a forged cross-site one is refused before its token is looked at.
        if changes and (why := cross_site(headers, host)):
            return refused(
                f"refused: {why}",
                "operator actions are taken from the dashboard's own page (or 'ledger "
                "resolve' and 'ledger redrive')",
            )
        if changes and not self.token:
            return refused(
                "operator actions need the dashboard's token, and none is configured",
                "set LEDGER_DASHBOARD__TOKEN and open the dashboard with #token=...; "
                "reading needs no token on loopback",
            )
        if (
            self.token
            and (changes or path.startswith(PROTECTED))
            and not authorized(headers.get("Authorization"), self.token)
        ):
            return unauthorized()
        return None


def _normal(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
