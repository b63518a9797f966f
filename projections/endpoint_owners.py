"""Which endpoint a delivery's recipient belongs to, as the projection can tell.

The rule is the workers' (streams/endpoint_gate.py ``endpoint_of``, streams/channels/
endpoints.py): a registered endpoint whose address is the recipient exactly, else for a
webhook the longest registered URL prefix covering it (scheme, host and port equal, whole
path segments), then a configured one (``LEDGER_CHANNELS__WEBHOOK_ENDPOINTS``), else the
recipient's own (a webhook's origin). Projections may not import streams, so
``RecipientPrefix`` repeats the prefix rule, and a test holds the two in agreement.
Asked by endpoint health (projections/health.py) and by the SLO a delivery is judged by
(projections/slo.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from events.redaction import redacted_url
from projections.fold import Row

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED_DOT = re.compile("%2e", re.IGNORECASE)
REGISTRY = "registry"


@dataclass(frozen=True)
class RecipientPrefix:
    """Origin and path segments of a URL, as ``streams/channels/endpoints.UrlPrefix``."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> RecipientPrefix | None:
        """The prefix of ``text``, or None when it is no http(s) URL with a host."""
        try:
            url = urlsplit(text)
            port = url.port
        except ValueError:
            return None
        if url.scheme not in _DEFAULT_PORTS or not url.hostname:
            return None
        out: list[str] = []
        for segment in _ENCODED_DOT.sub(".", url.path).split("/")[1:]:
            if segment == "..":
                if out:
                    out.pop()
            elif segment != ".":
                out.append(segment)
        while out and out[-1] == "":
            out.pop()
        host = url.hostname.lower().rstrip(".")
        return cls(url.scheme, host, port or _DEFAULT_PORTS[url.scheme], tuple(out))

    def covers(self, other: RecipientPrefix) -> bool:
        """Whether ``other`` lies under this prefix (same origin, whole segments)."""
        return (self.scheme, self.host, self.port) == (
            other.scheme,
            other.host,
            other.port,
        ) and other.segments[: len(self.segments)] == self.segments

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``, the port shown only when not the default."""
        port = "" if _DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}{port}"


class EndpointOwners:
    """The endpoints recipients belong to: registry (rows of the ``endpoints`` table),
    configured (webhook URL prefixes), or their own."""

    def __init__(self, registry: Iterable[Row], configured: Iterable[str] = ()) -> None:
        self._exact: dict[tuple[str, str], str] = {}
        self._webhooks: list[tuple[RecipientPrefix, str, str]] = []  # prefix, name, source
        for r in registry:
            self._exact[(r["channel"], r["address"])] = r["endpoint_id"]
            if r["channel"] == "webhook" and (p := RecipientPrefix.parse(r["address"])) is not None:
                self._webhooks.append((p, r["endpoint_id"], REGISTRY))
        self._configured: list[tuple[RecipientPrefix, str, str]] = []
        for text in configured:
            if (p := RecipientPrefix.parse(text)) is not None:
                self._configured.append((p, redacted_url(text), "settings"))
        self._found: dict[tuple[str, str], tuple[str, str]] = {}

    def owner(self, channel: str, recipient: str) -> tuple[str, str]:
        """(endpoint name, source: ``registry``, ``settings`` or ``recipient``) of a
        delivery's recipient."""
        key = (channel, recipient)
        if key not in self._found:
            self._found[key] = self._owner(channel, recipient)
        return self._found[key]

    def registered(self, channel: str, recipient: str) -> str | None:
        """The id of the registry endpoint the recipient belongs to, or None."""
        name, source = self.owner(channel, recipient)
        return name if source == REGISTRY else None

    def _owner(self, channel: str, recipient: str) -> tuple[str, str]:
        if (found := self._exact.get((channel, recipient))) is not None:
            return found, REGISTRY
        if channel != "webhook":
            return redacted_url(recipient), "recipient"
        target = RecipientPrefix.parse(recipient)
        if target is None:
            return redacted_url(recipient), "recipient"
        for candidates in (self._webhooks, self._configured):
            best = max(
                (c for c in candidates if c[0].covers(target)),
                key=lambda c: len(c[0].segments),
                default=None,
            )
            if best is not None:
                return best[1], best[2]
        return target.origin, "recipient"
