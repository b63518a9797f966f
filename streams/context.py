"""The decisions' Context, resolved from Settings and the worker's channels."""

from __future__ import annotations

from collections.abc import Mapping

from events.settings import Settings
from streams.channels.base import Channel
from streams.decisions import Context
from streams.retry import rules_for


def worker_context(
    settings: Settings, *, worker_id: str, producer: str, channels: Mapping[str, Channel]
) -> Context:
    """Every tunable from ``settings``; per-endpoint answers from the channel adapters."""

    def receiver_dedupes(channel: str, recipient: str) -> bool:
        return channels[channel].receiver_dedupes(recipient)

    def settle_s(channel: str, recipient: str) -> float:
        own = channels[channel].settle_s(recipient)
        return settings.lookup_settle_s if own is None else own

    return Context(
        worker_id=worker_id,
        producer=producer,
        rules=rules_for(settings),
        receiver_dedupes=receiver_dedupes,
        settle_s=settle_s,
        lease_s=settings.lease_seconds,
        claim_grace_s=settings.claim_grace_seconds,
        lookup_confirm_spacing_s=settings.lookup_confirm_spacing_s,
        lookup_backoff_s=settings.lookup_backoff_s,
        lookup_backoff_max_s=settings.lookup_backoff_max_s,
        max_lookups=settings.max_lookups,
        max_sent_polls=settings.max_sent_polls,
    )
