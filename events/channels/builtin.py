"""The built-in channels' light halves, registered under ``delivery_ledger.channels`` in
pyproject.toml like any plugin. Their adapters live in ``streams/channels/``."""

from __future__ import annotations

from events.channels.plugin import Capabilities, ChannelPlugin, DedupeRule, FirstAnswer, Lookup
from events.channels.urls import check_http_url, credentials_in

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
