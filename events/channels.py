"""The delivery channels the ledger knows, and what a valid recipient is for each."""

from __future__ import annotations

from urllib.parse import urlsplit

# webhook: Standard Webhooks POST to an endpoint URL.
# provider: a messaging-provider API (message id + queued/delivered status + lookup).
CHANNELS: frozenset[str] = frozenset({"webhook", "provider"})


def check_channel(channel: str) -> str:
    """Refuse a channel the ledger has no adapter for."""
    if channel not in CHANNELS:
        known = ", ".join(sorted(CHANNELS))
        raise ValueError(f"unknown channel {channel!r} (known channels: {known})")
    return channel


def check_recipient(channel: str, recipient: str) -> str:
    """Both channels address an http(s) URL with a host."""
    check_channel(channel)
    parts = urlsplit(recipient)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"recipient for channel {channel!r} must be an http(s) URL with a host, "
            f"got {recipient!r}"
        )
    if any(ch.isspace() for ch in recipient) or len(recipient) > 2000:
        raise ValueError(
            f"recipient URL is malformed or longer than 2000 characters: {recipient!r}"
        )
    return recipient
