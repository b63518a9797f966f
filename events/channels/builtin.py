"""The built-in channels' light halves, registered under ``delivery_ledger.channels`` in
pyproject.toml like any plugin. Their adapters live in ``streams/channels/``."""

from __future__ import annotations

from events.channels.browser_targets import TARGET_NAME, BrowserSettings
from events.channels.plugin import Capabilities, ChannelPlugin, DedupeRule, FirstAnswer, Lookup
from events.channels.urls import check_http_url, credentials_in, slack_recipient

# The rule a webhook endpoint may declare (``receiver_dedupes``); its name is what a
# retry's event records. Standard Webhooks receivers dedupe on webhook-id.
WEBHOOK_ID_DEDUPE = DedupeRule(
    name="webhook-id",
    description=(
        "the endpoint declares that its receiver dedupes on the idempotency key "
        "(webhook-id): receiver_dedupes=true"
    ),
)

webhook = ChannelPlugin(
    name="webhook",
    description="Standard Webhooks: a signed POST to the recipient URL",
    capabilities=Capabilities(
        key_carriers=("header webhook-id", "header Idempotency-Key"),
        # By key where the endpoint names a lookup_url; otherwise none.
        lookup=Lookup.BY_KEY,
        first_answer=FirstAnswer.CONFIRMED,
        dedupe_rule=WEBHOOK_ID_DEDUPE,
    ),
    check_recipient=check_http_url,
    refuse=credentials_in,
    adapter="streams.channels.webhook:adapter",
    settings_note="LEDGER_WEBHOOK_SECRET, LEDGER_WEBHOOK_ENDPOINTS",
)

provider = ChannelPlugin(
    name="provider",
    description="a messaging-provider API: message id, queued/delivered status, lookup by key",
    capabilities=Capabilities(
        key_carriers=("header Idempotency-Key",),
        lookup=Lookup.BY_KEY,
        first_answer=FirstAnswer.SENT,
        # Providers of this shape dedupe on Idempotency-Key only within a retention
        # window that is no contract: their lookup settles UNKNOWN, never a blind retry.
        dedupe_rule=None,
    ),
    check_recipient=check_http_url,
    refuse=credentials_in,
    adapter="streams.channels.provider:adapter",
)


def check_slack_recipient(recipient: str) -> None:
    """``WORKSPACE/CHANNEL_ID`` (the workspace names its bot token in LEDGER_SLACK_TOKENS)."""
    slack_recipient(recipient)


slack = ChannelPlugin(
    name="slack",
    description="a Slack message (Web API chat.postMessage), the key in its metadata",
    capabilities=Capabilities(
        key_carriers=("message metadata event_payload.idempotency_key",),
        # conversations.history with include_all_metadata, from the request's time on.
        lookup=Lookup.BY_KEY,
        # ok + ts: the message is in the conversation.
        first_answer=FirstAnswer.CONFIRMED,
        # Slack posts a second message for a second request: no rule makes a blind retry safe.
        dedupe_rule=None,
    ),
    check_recipient=check_slack_recipient,
    adapter="streams.channels.slack:adapter",
    settings_note="LEDGER_SLACK_TOKENS, LEDGER_SLACK_API_URL, LEDGER_SLACK_LOOKUP_MAX_PAGES",
)


def check_browser_recipient(recipient: str) -> None:
    """A target name (``[a-z0-9][a-z0-9_.-]*``) the workers' browser settings declare."""
    if not TARGET_NAME.match(recipient):
        raise ValueError(
            f"browser recipient {recipient[:80]!r} must be a target name matching "
            f"{TARGET_NAME.pattern} (declared in LEDGER_CHANNEL_SETTINGS browser.targets)"
        )


browser = ChannelPlugin(
    name="browser",
    description="a web form submitted by a headless Chromium (Playwright), declared per target",
    capabilities=Capabilities(
        key_carriers=("hidden form input", "URL parameter"),
        # The target's page or JSON that lists accepted keys (the target declares it).
        lookup=Lookup.BY_KEY,
        # The confirmation element with the target's id: the form was accepted.
        first_answer=FirstAnswer.CONFIRMED,
        # A form posted twice is two tickets: no rule makes a blind retry safe.
        dedupe_rule=None,
    ),
    check_recipient=check_browser_recipient,
    adapter="streams.channels.browser:adapter",
    settings_model=BrowserSettings,
    settings_note="pip extra: browser (Playwright); Chromium at /usr/bin/chromium",
)
