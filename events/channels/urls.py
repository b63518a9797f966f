"""Recipients that are http(s) URLs: their form, the credentials they may not carry, and
how to show one without its secrets (the built-in channels' rules; a plugin may reuse them)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from events.redaction import secret_params

# A Slack recipient is ``WORKSPACE/CHANNEL_ID``: the workspace names its bot token in the
# slack channel's ``tokens`` (so no credential is ever in a recipient), the channel is a
# conversation ID (C... public, G... private, D... direct), not a #name: names can be
# renamed and conversations.history, the lookup, takes IDs only.
SLACK_WORKSPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")
SLACK_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{2,20}")


def slack_recipient(recipient: str) -> tuple[str, str]:
    """Split a Slack recipient into (workspace, channel id); ValueError says what is wrong."""
    workspace, sep, channel = recipient.partition("/")
    if not sep or not SLACK_WORKSPACE.fullmatch(workspace):
        raise ValueError(
            "recipient for channel 'slack' must be WORKSPACE/CHANNEL_ID (workspace: 1-64 "
            f"letters, digits, '_' or '-'), got {recipient[:100]!r}"
        )
    if not SLACK_CHANNEL_ID.fullmatch(channel):
        raise ValueError(
            f"Slack channel {channel[:40]!r} is not a conversation ID (C/G/D + 2-20 capitals "
            "or digits, e.g. C0123ABCD); a #name cannot be looked up"
        )
    return workspace, channel


_ENDPOINT_HINT = "put credentials in the endpoint's settings (LEDGER_CHANNELS__WEBHOOK_ENDPOINTS)"


def check_http_url(recipient: str) -> None:
    """An http(s) URL with a host, no whitespace, at most 2000 characters."""
    parts = urlsplit(recipient)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"recipient must be an http(s) URL with a host, got {shown(recipient)!r}")
    if any(ch.isspace() for ch in recipient) or len(recipient) > 2000:
        raise ValueError(
            f"recipient URL is malformed or longer than 2000 characters: {shown(recipient)!r}"
        )


def credentials_in(recipient: str) -> str | None:
    """Why ``recipient`` may not be requested: it carries credentials, which would be
    kept in the log forever and shown in the dashboard, replay and evidence. None if not.

    Checked where a request is made (the SDK, and the worker before it claims), not when
    an event is read: events already in the log must stay readable."""
    parts = urlsplit(recipient)
    if parts.username is not None or parts.password is not None:
        return f"recipient URL carries credentials (user:password@): {_ENDPOINT_HINT}"
    # The names the display hides (events/redaction.py) are the names refused here.
    for part, text in (("query", parts.query), ("fragment", parts.fragment)):
        for name in secret_params(text):
            shown_name = name[:40]
            return (
                f"recipient URL carries a credential in its {part} ({shown_name}=...): "
                f"{_ENDPOINT_HINT}"
            )
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
