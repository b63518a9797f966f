"""The built-in channels' light halves, registered under ``delivery_ledger.channels`` in
pyproject.toml like any plugin. Their adapters live in ``streams/channels/``."""

from __future__ import annotations

from events.channels.browser_targets import TARGET_NAME, BrowserSettings
from events.channels.email_address import check_email_recipient, email_refusal
from events.channels.email_api import IDEMPOTENCY_KEY_DEDUPE, EmailApiSettings
from events.channels.mail import SmtpSettings
from events.channels.plugin import Capabilities, ChannelPlugin, DedupeRule, FirstAnswer, Lookup
from events.channels.slack import SlackSettings
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
    settings_note="LEDGER_CHANNELS__WEBHOOK_SECRET, LEDGER_CHANNELS__WEBHOOK_ENDPOINTS",
)

# The ledger's own generic shape of a messaging-provider API (POST to the recipient URL,
# queued/delivered, lookup by key): no real provider speaks it. Kept under its name because
# the idempotency key is derived from the channel name: renaming it would give the same
# logical event a new key, and the log, the demo and receivers built for it use it.
# Real email over an HTTP API is ``email_api``.
provider = ChannelPlugin(
    name="provider",
    description=(
        "the ledger's generic messaging-provider API shape: POST to the recipient URL, "
        "message id, queued/delivered status, lookup by key"
    ),
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
    """``WORKSPACE/CHANNEL_ID`` (the workspace names its bot token in slack's ``tokens``)."""
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
    settings_model=SlackSettings,
)

# The rule an smtp endpoint may declare (``receiver_dedupes_message_id``): its receiver
# drops a message whose Message-ID it has already accepted. Never assumed: most relays
# and mailboxes keep every copy.
MESSAGE_ID_DEDUPE = DedupeRule(
    name="message-id",
    description=(
        "the smtp settings declare that the receiver drops a repeated Message-ID "
        "<KEY@DOMAIN>: receiver_dedupes_message_id=true"
    ),
)

smtp = ChannelPlugin(
    name="smtp",
    description="an email over SMTP (aiosmtplib), Message-ID <KEY@DOMAIN>; IMAP archive lookup",
    capabilities=Capabilities(
        key_carriers=("header Message-ID <KEY@DOMAIN>", "header Idempotency-Key"),
        # IMAP SEARCH by Message-ID in an archive (BCC/journal) mailbox, where configured.
        lookup=Lookup.BY_KEY,
        # 250 after DATA: a relay took the message; nobody has read it.
        first_answer=FirstAnswer.SENT,
        dedupe_rule=MESSAGE_ID_DEDUPE,
    ),
    check_recipient=check_email_recipient,
    refuse=email_refusal,
    adapter="streams.channels.smtp:adapter",
    settings_model=SmtpSettings,
)

email_api = ChannelPlugin(
    name="email_api",
    description=(
        "an email over an HTTP email API (Resend/Postmark-like): POST /emails with "
        "Idempotency-Key, status by lookup"
    ),
    capabilities=Capabilities(
        key_carriers=("header Idempotency-Key", "email header X-Ledger-Idempotency-Key"),
        # GET /emails?idempotency_key=K settles an UNKNOWN (this API shape's contract; off
        # with lookup_by_key=false); a SENT is polled by GET /emails/{id}.
        lookup=Lookup.BY_KEY,
        # The answer's id: the provider accepted it, nobody read it yet. ``delivered``
        # (by lookup) confirms.
        first_answer=FirstAnswer.SENT,
        # Applied only where provider_dedupes=true, and only within 24 h of the request.
        dedupe_rule=IDEMPOTENCY_KEY_DEDUPE,
    ),
    check_recipient=check_email_recipient,
    refuse=email_refusal,
    adapter="streams.channels.email_api:adapter",
    settings_model=EmailApiSettings,
)


def check_browser_recipient(recipient: str) -> None:
    """A target name (``[a-z0-9][a-z0-9_.-]*``) the workers' browser settings declare."""
    if not TARGET_NAME.match(recipient):
        raise ValueError(
            f"browser recipient {recipient[:80]!r} must be a target name matching "
            f"{TARGET_NAME.pattern} (declared in LEDGER_CHANNELS__SETTINGS browser.targets)"
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
