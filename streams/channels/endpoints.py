"""Which configured webhook endpoint a recipient URL belongs to, decided on the parsed URL.

An endpoint's secret signs what goes to it, so choosing it by a raw string prefix hands
the secret to ``https://api.customer.test.evil.test/`` or ``…test@evil.test/``. Both URLs
are parsed the way the request will be sent (``httpx.URL``, the sender's own parser):
scheme, host and port must be equal (default ports normalised), and the endpoint's path
must be a whole-segment prefix of the recipient's (``/hooks`` is not ``/hooksevil``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import httpx
from standardwebhooks import Webhook

from config.parts import ChannelSettings, WebhookEndpoint
from events.errors import ConfigError, LedgerError
from streams.channels.signature import signer, signing_key

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}
# A percent-encoded dot is a dot to many servers: "/hooks/%2e%2e/admin" is "/admin".
_ENCODED_DOT = re.compile("%2e", re.IGNORECASE)


def _segments(raw_path: str) -> tuple[str, ...]:
    """The path's segments with dot segments removed (RFC 3986 5.2.4), no trailing empty one."""
    out: list[str] = []
    for segment in _ENCODED_DOT.sub(".", raw_path).split("/")[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    while out and out[-1] == "":
        out.pop()
    return tuple(out)


@dataclass(frozen=True)
class UrlPrefix:
    """The parts of a URL that decide where a request goes: origin and path segments."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> UrlPrefix:
        """``text`` parsed; ValueError says what is wrong, without repeating the URL."""
        try:
            url = httpx.URL(text)
        except (httpx.InvalidURL, TypeError, ValueError):
            raise ValueError("is not a URL") from None
        if url.scheme not in _DEFAULT_PORTS:
            raise ValueError("is not an http:// or https:// URL")
        if not url.raw_host:
            raise ValueError("has no host")
        host = url.raw_host.decode("ascii").lower().rstrip(".")
        port = url.port if url.port is not None else _DEFAULT_PORTS[url.scheme]
        path = url.raw_path.decode("ascii").split("?", 1)[0]
        return cls(url.scheme, host, port, _segments(path))

    def covers(self, other: UrlPrefix) -> bool:
        """True if ``other`` goes to this origin, at this path or below it."""
        return (self.scheme, self.host, self.port) == (
            other.scheme,
            other.host,
            other.port,
        ) and other.segments[: len(self.segments)] == self.segments


def endpoint_prefix(text: str) -> UrlPrefix:
    """A configured endpoint key as a prefix: no credentials, query or fragment in it."""
    prefix = UrlPrefix.parse(text)
    url = httpx.URL(text)
    if url.userinfo:
        raise ValueError("has credentials in it (put the secret in 'secrets')")
    if url.query or url.fragment:
        raise ValueError("has a query or fragment (an endpoint is an origin and a path)")
    return prefix


def recipient_prefix(recipient: str) -> UrlPrefix | None:
    """The recipient parsed as a request would be, or None if it cannot be requested."""
    try:
        return UrlPrefix.parse(recipient)
    except ValueError:
        return None


SIGNING_HINT = (
    "set LEDGER_CHANNELS__WEBHOOK_SECRET=whsec_<base64> (or give every endpoint in "
    'LEDGER_CHANNELS__WEBHOOK_ENDPOINTS its own "secrets"); make one with: python -c '
    "'import base64,os; print(\"whsec_\" + base64.b64encode(os.urandom(32)).decode())'"
)


@dataclass(frozen=True)
class ResolvedEndpoint:
    """What applies to one recipient URL: its signers and the optional lookup URL."""

    prefix: UrlPrefix | None  # the settings.webhook_endpoints entry that matched, if any
    signers: tuple[Webhook, ...] = ()  # one per active secret; empty: nothing may be sent
    lookup_url: str | None = None
    receiver_dedupes: bool = False
    settle_s: float | None = None
    # The same secrets' key bytes: they sign the fencing token and lookups.
    keys: tuple[bytes, ...] = field(default=(), repr=False)


def _shown(prefix: UrlPrefix) -> str:
    """An endpoint for an error line: its origin and path, nothing else from its key."""
    host = f"[{prefix.host}]" if ":" in prefix.host else prefix.host
    return f"{prefix.scheme}://{host}:{prefix.port}/" + "/".join(prefix.segments)


def _resolve(key: str, number: int, endpoint: WebhookEndpoint) -> ResolvedEndpoint:
    try:
        prefix = endpoint_prefix(key)
    except ValueError as exc:
        # The key itself is not repeated: a malformed one may carry a credential.
        raise ConfigError(
            f"webhook endpoint number {number} in LEDGER_CHANNELS__WEBHOOK_ENDPOINTS {exc}",
            "an endpoint key is a URL prefix such as https://hooks.example/hooks/",
        ) from None
    try:
        signers = tuple(signer(secret) for secret in endpoint.signing_secrets())
        keys = tuple(signing_key(secret) for secret in endpoint.signing_secrets())
    except ValueError as exc:
        raise ConfigError(
            f"webhook endpoint {_shown(prefix)!r}: {exc}",
            "a Standard Webhooks secret is 'whsec_' followed by base64",
        ) from None
    return ResolvedEndpoint(
        prefix, signers, endpoint.lookup_url, endpoint.receiver_dedupes, endpoint.settle_s, keys
    )


def _resolve_all(
    settings: ChannelSettings, configured: Mapping[str, WebhookEndpoint] | None = None
) -> tuple[ResolvedEndpoint, list[ResolvedEndpoint]]:
    """The default (global secret) and every configured endpoint (``configured``, else the
    settings'), checked: a bad key or secret, or a worker that could not sign some
    delivery, is a LedgerError naming it."""
    if configured is None:
        configured = settings.webhook_endpoints
    default_signers: tuple[Webhook, ...] = ()
    default_keys: tuple[bytes, ...] = ()
    if settings.webhook_secret is not None:
        try:
            default_signers = (signer(settings.webhook_secret),)
            default_keys = (signing_key(settings.webhook_secret),)
        except ValueError as exc:
            raise ConfigError(f"LEDGER_CHANNELS__WEBHOOK_SECRET: {exc}", SIGNING_HINT) from None
    endpoints = [
        _resolve(key, number, endpoint)
        for number, (key, endpoint) in enumerate(configured.items(), 1)
    ]
    seen: dict[UrlPrefix, None] = {}
    for endpoint in endpoints:
        assert endpoint.prefix is not None
        if endpoint.prefix in seen:
            raise ConfigError(
                f"webhook endpoints: {_shown(endpoint.prefix)!r} is configured twice",
                "keep one entry per URL prefix in LEDGER_CHANNELS__WEBHOOK_ENDPOINTS",
            )
        seen[endpoint.prefix] = None
    if not default_signers:
        unsigned = [e for e in endpoints if not e.signers]
        if not endpoints or unsigned:
            which = (
                f" and endpoint {_shown(unsigned[0].prefix)!r} has none of its own"
                if unsigned and unsigned[0].prefix is not None
                else ""
            )
            raise ConfigError(
                f"no webhook signing secret: LEDGER_CHANNELS__WEBHOOK_SECRET is not set{which}",
                SIGNING_HINT,
            )
    endpoints = [
        e if e.signers else dataclasses.replace(e, signers=default_signers, keys=default_keys)
        for e in endpoints
    ]
    return ResolvedEndpoint(None, default_signers, keys=default_keys), endpoints


# Recipients whose endpoint is remembered. The answer depends only on the recipient and
# the settings (fixed for the process), and parsing a URL with httpx was ~2% of a
# worker's CPU in a backlog drain (asked twice per send).
RESOLVED_RECIPIENTS = 10_000


class EndpointOverlay(Protocol):
    """Webhook endpoints that come and go while the worker runs (the endpoint registry,
    clients/endpoint_registry.py)."""

    def webhook_endpoints(
        self, now: datetime
    ) -> tuple[object, Mapping[str, WebhookEndpoint], frozenset[str]]:
        """(a token that changes when they do, the endpoints by URL prefix, the prefixes
        that must sign with nothing: their secrets cannot be read here)."""
        ...


class WebhookEndpoints:
    """The configured endpoints, checked at start (``LedgerError`` names what is wrong),
    and the one that applies to a recipient. With an ``overlay`` (the registry), its
    endpoints replace the settings' for the same prefix and join the others; a change
    applies at the next recipient asked about."""

    def __init__(self, settings: ChannelSettings, overlay: EndpointOverlay | None = None) -> None:
        self._settings = settings
        self.default, self.endpoints = _resolve_all(settings)
        self._resolved: dict[str, ResolvedEndpoint] = {}  # insertion order: oldest first
        self._overlay = overlay
        self._token: object = None

    def _follow_overlay(self) -> None:
        assert self._overlay is not None
        token, registered, unreadable = self._overlay.webhook_endpoints(datetime.now(UTC))
        if token == self._token:
            return
        self._token = token
        self._resolved = {}
        ours: list[ResolvedEndpoint] = []
        for number, (address, endpoint) in enumerate(registered.items(), 1):
            try:
                _, [resolved] = _resolve_all(self._settings, {address: endpoint})
            except LedgerError as exc:
                log.error("registry webhook endpoint number %d not used: %s", number, exc)
                continue
            ours.append(resolved)
        for address in unreadable:
            try:
                ours.append(ResolvedEndpoint(endpoint_prefix(address)))  # signs nothing
            except ValueError:
                continue
        taken = {e.prefix for e in ours}
        _, configured = _resolve_all(self._settings)
        self.endpoints = [*ours, *(e for e in configured if e.prefix not in taken)]

    def for_recipient(self, recipient: str) -> ResolvedEndpoint:
        """The endpoint whose parsed URL covers ``recipient`` with the most path segments,
        else the defaults (the global secret, no lookup)."""
        if self._overlay is not None:
            self._follow_overlay()
        resolved = self._resolved.get(recipient)
        if resolved is None:
            resolved = self._resolve(recipient)
            if len(self._resolved) >= RESOLVED_RECIPIENTS:
                del self._resolved[next(iter(self._resolved))]
            self._resolved[recipient] = resolved
        return resolved

    def _resolve(self, recipient: str) -> ResolvedEndpoint:
        target = recipient_prefix(recipient)
        best = self.default
        if target is None:
            return best
        for endpoint in self.endpoints:
            assert endpoint.prefix is not None
            if endpoint.prefix.covers(target) and (
                best.prefix is None or len(endpoint.prefix.segments) > len(best.prefix.segments)
            ):
                best = endpoint
        return best
