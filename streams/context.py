"""The decisions' Context, resolved from Settings and the worker's channels."""

from __future__ import annotations

from collections.abc import Mapping

from config.settings import Settings
from events.channels import DedupeRule, channel_plugin
from streams.channels.base import Channel
from streams.decisions import Context
from streams.retry import rules_for


def worker_context(
    settings: Settings, *, worker_id: str, producer: str, channels: Mapping[str, Channel]
) -> Context:
    """Every tunable from ``settings``; per-endpoint answers from the channel adapters."""

    def dedupe_rule(channel: str, recipient: str) -> DedupeRule | None:
        # The channel names its rule; the adapter says whether this recipient's endpoint
        # declares it. An adapter that says so for a channel without a rule gets none.
        if not channels[channel].receiver_dedupes(recipient):
            return None
        return channel_plugin(channel).capabilities.dedupe_rule

    def settle_s(channel: str, recipient: str) -> float:
        own = channels[channel].settle_s(recipient)
        return settings.worker.lookup_settle_s if own is None else own

    return Context(
        worker_id=worker_id,
        producer=producer,
        rules=rules_for(settings),
        dedupe_rule=dedupe_rule,
        settle_s=settle_s,
        lease_s=settings.worker.lease_s,
        claim_grace_s=settings.worker.claim_grace_s,
        lookup_confirm_spacing_s=settings.worker.lookup_confirm_spacing_s,
        lookup_backoff_s=settings.worker.lookup_backoff_s,
        lookup_backoff_max_s=settings.worker.lookup_backoff_max_s,
        max_lookups=settings.worker.max_lookups,
        max_sent_polls=settings.worker.max_sent_polls,
    )
