"""The delivery channels the ledger knows, and what a valid recipient is for each."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

# webhook: Standard Webhooks POST to an endpoint URL.
# provider: a messaging-provider API (message id + queued/delivered status + lookup).
CHANNELS: frozenset[str] = frozenset({"webhook", "provider"})


def check_channel(channel: str) -> str:
    """Refuse a channel the ledger has no adapter for."""
    if channel not in CHANNELS:
        known = ", ".join(sorted(CHANNELS))
        raise ValueError(f"unknown channel {channel!r} (known channels: {known})")
    return channel


# Query parameter names that carry credentials (matched on the lowercased name's end).
_SECRET_PARAM = re.compile(
    r"(^|[_.-])(api[_-]?key|token|secret|password|passwd|pwd|auth|authorization)$"
)
_ENDPOINT_HINT = "put credentials in the endpoint's settings (LEDGER_WEBHOOK_ENDPOINTS)"


def check_recipient(channel: str, recipient: str) -> str:
    """Both channels address an http(s) URL with a host."""
    check_channel(channel)
    parts = urlsplit(recipient)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"recipient for channel {channel!r} must be an http(s) URL with a host, "
            f"got {shown(recipient)!r}"
        )
    if any(ch.isspace() for ch in recipient) or len(recipient) > 2000:
        raise ValueError(
            f"recipient URL is malformed or longer than 2000 characters: {shown(recipient)!r}"
        )
    return recipient


def credentials_in(recipient: str) -> str | None:
    """Why ``recipient`` may not be requested: it carries credentials, which would be
    kept in the log forever and shown in the dashboard, replay and evidence. None if not.

    Checked where a request is made (the SDK, and the worker before it claims), not when
    an event is read: events already in the log must stay readable."""
    parts = urlsplit(recipient)
    if parts.username is not None or parts.password is not None:
        return f"recipient URL carries credentials (user:password@): {_ENDPOINT_HINT}"
    for name, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_PARAM.search(name.lower()):
            return f"recipient URL carries a credential in its query ({name}=...): {_ENDPOINT_HINT}"
    return None


def shown(url: str) -> str:
    """``url`` fit to show: without user:password@ and with every query value hidden."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        query = "&".join(f"{n}=..." for n, _ in parse_qsl(parts.query, keep_blank_values=True))
        return parts._replace(netloc=netloc, query=query).geturl()
    except ValueError:
        return "<unparseable URL>"
