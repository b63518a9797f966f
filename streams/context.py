"""The decisions' Context, resolved from the worker's settings parts and its channels."""

from __future__ import annotations

from collections.abc import Mapping

from config.parts import ChannelSettings, WorkerSettings
from events.channels import DedupeRule, channel_plugin
from streams.channels.base import Channel
from streams.decisions import Context
from streams.retry import EndpointPolicy, endpoint_rules, rules_for


def worker_context(
    worker: WorkerSettings,
    sends: ChannelSettings,
    *,
    worker_id: str,
    producer: str,
    channels: Mapping[str, Channel],
    endpoint_policy: EndpointPolicy | None = None,
) -> Context:
    """Every tunable from the worker's part, the retry rules from the channels part
    (``endpoint_policy``: the registry's, which wins where it sets one); per-endpoint
    answers from the channel adapters."""

    def dedupe_rule(channel: str, recipient: str) -> DedupeRule | None:
        # The channel names its rule; the adapter says whether this recipient's endpoint
        # declares it. An adapter that says so for a channel without a rule gets none.
        if not channels[channel].receiver_dedupes(recipient):
            return None
        return channel_plugin(channel).capabilities.dedupe_rule

    def settle_s(channel: str, recipient: str) -> float:
        own = channels[channel].settle_s(recipient)
        return worker.lookup_settle_s if own is None else own

    return Context(
        worker_id=worker_id,
        producer=producer,
        rules=endpoint_rules(rules_for(sends), endpoint_policy),
        dedupe_rule=dedupe_rule,
        settle_s=settle_s,
        lease_s=worker.lease_s,
        claim_grace_s=worker.claim_grace_s,
        lookup_confirm_spacing_s=worker.lookup_confirm_spacing_s,
        lookup_backoff_s=worker.lookup_backoff_s,
        lookup_backoff_max_s=worker.lookup_backoff_max_s,
        max_lookups=worker.max_lookups,
        max_sent_polls=worker.max_sent_polls,
    )
