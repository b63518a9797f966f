"""Where a delivery's rate limit comes from: ``RateLimitSource`` and its settings version.

The gate (streams/rate_gate.py) asks ``limit_for(channel, recipient)`` and keeps one token
bucket per ``RateLimit.endpoint``. Today the limits are settings:

* a webhook endpoint's own ``rate_limit_per_s`` (``LEDGER_CHANNELS__WEBHOOK_ENDPOINTS``),
  matched on the parsed URL like its secret (streams/channels/endpoints.py: scheme, host
  and port equal, whole path segments, the longest prefix wins), so every recipient URL
  under the endpoint shares its bucket;
* ``LEDGER_CHANNELS__RATE_LIMITS``, by ``channel:recipient-prefix`` (a plain string
  prefix) or a bare ``channel``; the longest matching key wins. For any channel, webhooks
  included when the endpoint has no limit of its own.

and, first, the endpoint registry (``ledger.endpoints``, clients/endpoint_registry.py): a
registered endpoint's ``rate_limit_per_s``, for the recipients the endpoint gate places in
it (streams/endpoint_gate.py), picked up when the registry changes, without a restart
(``FirstRateLimit`` asks the registry, then the settings). The registry has no burst: its
endpoints get the gate's default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from config.parts import ChannelSettings
from streams.channels.endpoints import UrlPrefix, endpoint_prefix, recipient_prefix
from streams.endpoint_gate import Registry

WEBHOOK = "webhook"
# Recipients whose limit is remembered (the answer is fixed for the process's settings).
REMEMBERED = 10_000


@dataclass(frozen=True)
class RateLimit:
    """At most ``per_s`` deliveries per second to ``endpoint``, over all workers."""

    endpoint: str  # what shares one bucket, e.g. "webhook:https://host:443/hooks"
    per_s: float
    burst: float | None = None  # tokens a quiet endpoint may save (None: the gate's default)


class RateLimitSource(Protocol):
    """The rate limit of a recipient, if it has one."""

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        """The limit that applies to ``recipient`` of ``channel``, or None."""
        ...


class NoRateLimits:
    """No limit anywhere."""

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        """Never a limit."""
        return None


class SettingsRateLimits:
    """The limits in ``ChannelSettings``: webhook endpoints' own, then ``rate_limits``."""

    def __init__(self, settings: ChannelSettings) -> None:
        self._webhooks: list[tuple[UrlPrefix, RateLimit]] = []
        for key, endpoint in settings.webhook_endpoints.items():
            if endpoint.rate_limit_per_s is None:
                continue
            try:
                prefix = endpoint_prefix(key)
            except ValueError:
                continue  # the webhook channel refuses it at start, with the reason
            shown = f"{prefix.scheme}://{prefix.host}:{prefix.port}/" + "/".join(prefix.segments)
            limit = RateLimit(
                f"{WEBHOOK}:{shown}", endpoint.rate_limit_per_s, endpoint.rate_limit_burst
            )
            self._webhooks.append((prefix, limit))
        self._prefixes: list[tuple[str, str, RateLimit]] = []
        for key, spec in settings.rate_limits.items():
            channel, _, prefix_text = key.partition(":")
            self._prefixes.append((channel, prefix_text, RateLimit(key, spec.per_s, spec.burst)))
        # Longest first: the first match is the most specific.
        self._prefixes.sort(key=lambda entry: len(entry[1]), reverse=True)
        self._remembered: dict[tuple[str, str], RateLimit | None] = {}

    @property
    def any(self) -> bool:
        """Whether any limit is configured at all."""
        return bool(self._webhooks or self._prefixes)

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        """The webhook endpoint's own limit, else the longest ``rate_limits`` key's."""
        if not self.any:
            return None
        asked = (channel, recipient)
        if asked in self._remembered:
            return self._remembered[asked]
        found = self._find(channel, recipient)
        if len(self._remembered) >= REMEMBERED:
            del self._remembered[next(iter(self._remembered))]
        self._remembered[asked] = found
        return found

    def _find(self, channel: str, recipient: str) -> RateLimit | None:
        if channel == WEBHOOK and self._webhooks:
            target = recipient_prefix(recipient)
            best: tuple[UrlPrefix, RateLimit] | None = None
            if target is not None:
                for prefix, limit in self._webhooks:
                    if prefix.covers(target) and (
                        best is None or len(prefix.segments) > len(best[0].segments)
                    ):
                        best = (prefix, limit)
            if best is not None:
                return best[1]
        for limited, prefix_text, limit in self._prefixes:
            if limited == channel and recipient.startswith(prefix_text):
                return limit
        return None


class RegistryRateLimits:
    """The registry's limits: ``endpoint_of`` places a recipient in an endpoint (the
    endpoint gate's matching), whose spec may carry ``rate_limit_per_s``."""

    def __init__(self, registry: Registry, endpoint_of: Callable[[str, str], str | None]) -> None:
        self._registry = registry
        self._endpoint_of = endpoint_of

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        """The limit of the recipient's registered endpoint, if it has one."""
        endpoint_id = self._endpoint_of(channel, recipient)
        if endpoint_id is None:
            return None
        endpoint = self._registry.endpoints.get(endpoint_id)
        if endpoint is None or endpoint.spec.rate_limit_per_s is None:
            return None
        return RateLimit(f"endpoint:{endpoint_id}", endpoint.spec.rate_limit_per_s)


class FirstRateLimit:
    """Several sources in order: the first that has a limit for a recipient decides."""

    def __init__(self, sources: Sequence[RateLimitSource]) -> None:
        self._sources = tuple(sources)

    def limit_for(self, channel: str, recipient: str) -> RateLimit | None:
        """The first source's limit, or None."""
        for source in self._sources:
            limit = source.limit_for(channel, recipient)
            if limit is not None:
                return limit
        return None
