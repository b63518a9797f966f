"""The endpoint registry on ``ledger.endpoints``: read it, follow it, append to it.

``read_registry`` reads the topic once to its end (the CLI, before it decides).
``EndpointRegistry`` reads it from the beginning and then follows it in the background
(the worker, the projector's dashboard), so a change applies without a restart: its
``version`` grows with every change, and readers that derive something from the table
(the webhook channel's signers, the endpoint gate's answers) rebuild when it moves.
``append_endpoint_event`` writes one event, keyed by endpoint id (acks=all, idempotent).

A record that is not an endpoint event, or is keyed other than by its endpoint id
(``decode_endpoint_record``), is skipped, logged and counted (``refused``). It is not
dead-lettered here: every worker and dashboard follows the whole compacted topic, so each
would send its own copy of every bad record, again at every restart. The live projector
reads the topic once per projection and dead-letters it (projections/deadletters.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import SecretStr

from clients.endpoint_secrets import SecretBox, SecretUnreadable
from clients.kafka_security import append_one
from clients.topic_follower import READ_TIMEOUT_S, TopicFollower, read_to_end
from config.parts import KafkaSettings, WebhookEndpoint
from events.codec import encode
from events.endpoints import (
    AnyEndpointEvent,
    EndpointDecodeError,
    EndpointEvent,
    EndpointState,
    decode_endpoint_record,
    fold,
)

log = logging.getLogger(__name__)


async def read_events(
    kafka: KafkaSettings, timeout_s: float = READ_TIMEOUT_S
) -> list[AnyEndpointEvent]:
    """Every endpoint event now in the topic, in log order (bad records skipped, logged)."""
    events: list[AnyEndpointEvent] = []

    def take(record: Any) -> None:
        event = _decoded(record)
        if event is not None:
            events.append(event)

    await read_to_end(kafka, kafka.topic_endpoints, take, timeout_s=timeout_s)
    return events


async def read_registry(kafka: KafkaSettings) -> dict[str, EndpointState]:
    """Every endpoint now in the registry, by id."""
    table: dict[str, EndpointState] = {}
    for event in await read_events(kafka):
        table[event.endpoint_id] = fold(table.get(event.endpoint_id), event)
    return table


async def append_endpoint_event(kafka: KafkaSettings, event: EndpointEvent) -> None:
    """Write ``event`` to the registry and wait until the broker has it."""
    await append_one(kafka, kafka.topic_endpoints, encode(event), event.endpoint_id.encode("utf-8"))


def _decoded(record: object) -> AnyEndpointEvent | None:
    try:
        return decode_endpoint_record(getattr(record, "value", None), getattr(record, "key", None))
    except EndpointDecodeError as exc:
        log.warning(
            "skipped %s[%s]@%s: %s",
            getattr(record, "topic", "?"),
            getattr(record, "partition", "?"),
            getattr(record, "offset", "?"),
            exc,
        )
        return None


class EndpointRegistry(TopicFollower):
    """The registry, followed in the background: ``endpoints`` is always the latest table
    this process has read, ``version`` counts its changes."""

    def __init__(
        self, kafka: KafkaSettings, box: SecretBox | None = None, poll_s: float = 0.2
    ) -> None:
        super().__init__(
            kafka, kafka.topic_endpoints, missing="no endpoints from the registry", poll_s=poll_s
        )
        self._box = box
        self.endpoints: dict[str, EndpointState] = {}
        self.version = 0
        # Records skipped as not endpoint events (each read counts: a restart reads again).
        self.refused = 0
        self._warned: set[str] = set()
        # Webhook endpoints derived from the table (decrypted), rebuilt when it changes or
        # when a rotated-out secret expires.
        self._webhooks: tuple[object, dict[str, WebhookEndpoint], frozenset[str]] | None = None

    def take(self, record: Any) -> None:
        """One record of the registry: folded in, or skipped and counted."""
        event = _decoded(record)
        if event is None:
            self.refused += 1
        else:
            self.apply(event)

    def apply(self, event: EndpointEvent) -> None:
        """Fold one event in (what the follower does with each record)."""
        before = self.endpoints.get(event.endpoint_id)
        after = fold(before, event)
        if after is not before:
            self.endpoints = {**self.endpoints, event.endpoint_id: after}
            self.version += 1

    # -- what the worker derives --------------------------------------------------------

    def webhook_endpoints(
        self, now: datetime
    ) -> tuple[object, Mapping[str, WebhookEndpoint], frozenset[str]]:
        """(a token that changes when they do, the registry's webhook endpoints by
        address with their active secrets decrypted, the addresses whose secrets this
        process cannot decrypt: those must not be signed with anything else)."""
        token = (self.version, self._expired_count(now))
        if self._webhooks is not None and self._webhooks[0] == token:
            return self._webhooks
        endpoints: dict[str, WebhookEndpoint] = {}
        unreadable: set[str] = set()
        for state in self.endpoints.values():
            if state.spec.channel != "webhook":
                continue
            try:
                secrets = [self._decrypt(s.ciphertext) for s in state.active_secrets(now)]
            except SecretUnreadable as exc:
                if state.endpoint_id not in self._warned:
                    self._warned.add(state.endpoint_id)
                    log.error("endpoint %s: %s; nothing is sent to it", state.endpoint_id, exc)
                unreadable.add(state.spec.address)
                continue
            endpoints[state.spec.address] = WebhookEndpoint(
                secrets=secrets,
                lookup_url=state.spec.lookup_url,
                receiver_dedupes=state.spec.receiver_dedupes,
                settle_s=state.spec.settle_s,
            )
        self._webhooks = (token, endpoints, frozenset(unreadable))
        return self._webhooks

    def _decrypt(self, token: str) -> SecretStr:
        if self._box is None:
            raise SecretUnreadable("LEDGER_ENDPOINTS__ENCRYPTION_KEYS is not set")
        return self._box.decrypt(token)

    def _expired_count(self, now: datetime) -> int:
        return sum(
            1
            for state in self.endpoints.values()
            for secret in state.secrets
            if secret.expires_at is not None and secret.expires_at <= now
        )
