"""Who may ask the dashboard: the Host a request names, its bearer token, the binding.

A page on ``attacker.example`` whose name is re-pointed at 127.0.0.1 (DNS rebinding)
reaches a loopback dashboard from the victim's browser, same-origin as far as the
browser knows; only the ``Host`` header gives it away. So every request must name the
bound address, a loopback name when bound to loopback, or a configured name
(``LEDGER_DASHBOARD__ALLOWED_HOSTS``). An IP literal cannot be re-pointed, so when the
dashboard listens on every interface any address is accepted.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re

from aiohttp import web

from config.parts import DashboardSettings
from events.addresses import is_loopback
from events.errors import LedgerError

MIN_TOKEN_BYTES = 32
# Longer than this is not a token we issued: refused without comparing.
MAX_TOKEN_BYTES = 1024
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


def unauthorized() -> web.HTTPUnauthorized:
    """401 with a challenge and no data."""
    return web.HTTPUnauthorized(
        text=json.dumps({"error": "bearer token required"}),
        content_type="application/json",
        headers={"WWW-Authenticate": 'Bearer realm="ledger-dashboard"'},
    )


def misdirected() -> web.HTTPMisdirectedRequest:
    """421 with a short body and no data: the request named a host that is not this one."""
    return web.HTTPMisdirectedRequest(
        text="unknown Host; the dashboard answers only to its own names "
        "(LEDGER_DASHBOARD__ALLOWED_HOSTS adds one)\n"
    )


def _normal(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
