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

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import datetime

from aiokafka import AIOKafkaProducer, TopicPartition
from pydantic import SecretStr

from clients.committed_log import TRANSIENT, CommittedLog
from clients.endpoint_secrets import SecretBox, SecretUnreadable
from clients.kafka_security import client_options, start_producer
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
from events.errors import LedgerError

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0


async def read_events(
    kafka: KafkaSettings, timeout_s: float = READ_TIMEOUT_S
) -> list[AnyEndpointEvent]:
    """Every endpoint event now in the topic, in log order (bad records skipped, logged)."""
    async with CommittedLog(kafka) as reader:
        partitions = await reader.partitions(kafka.topic_endpoints)
        ends = await reader.ends(partitions)
        reader.assign(partitions, dict.fromkeys(partitions, 0))
        events: list[AnyEndpointEvent] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for tp in partitions:
            while await reader.position(tp) < ends[tp]:
                if loop.time() > deadline:
                    raise LedgerError(
                        f"could not read {kafka.topic_endpoints} to its end in {timeout_s:.0f}s",
                        "check the broker ('ledger broker logs')",
                    )
                for record in (await reader.read(500, 1000)).get(tp, []):
                    event = _decoded(record)
                    if event is not None:
                        events.append(event)
        return events


async def read_registry(kafka: KafkaSettings) -> dict[str, EndpointState]:
    """Every endpoint now in the registry, by id."""
    table: dict[str, EndpointState] = {}
    for event in await read_events(kafka):
        table[event.endpoint_id] = fold(table.get(event.endpoint_id), event)
    return table


async def append_endpoint_event(kafka: KafkaSettings, event: EndpointEvent) -> None:
    """Write ``event`` to the registry and wait until the broker has it."""
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        **client_options(kafka),
    )
    await start_producer(producer, kafka)
    try:
        await producer.send_and_wait(
            kafka.topic_endpoints, encode(event), key=event.endpoint_id.encode("utf-8")
        )
    finally:
        await producer.stop()


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


class EndpointRegistry:
    """The registry, followed in the background: ``endpoints`` is always the latest table
    this process has read, ``version`` counts its changes."""

    def __init__(
        self, kafka: KafkaSettings, box: SecretBox | None = None, poll_s: float = 0.2
    ) -> None:
        self._kafka = kafka
        self._box = box
        self._poll_ms = int(poll_s * 1000)
        self.endpoints: dict[str, EndpointState] = {}
        self.version = 0
        # Records skipped as not endpoint events (each read counts: a restart reads again).
        self.refused = 0
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned: set[str] = set()
        # Webhook endpoints derived from the table (decrypted), rebuilt when it changes or
        # when a rotated-out secret expires.
        self._webhooks: tuple[object, dict[str, WebhookEndpoint], frozenset[str]] | None = None

    @property
    def ready(self) -> bool:
        """True once the registry was read to the end it had when reading began."""
        return self.caught_up.is_set()

    def apply(self, event: EndpointEvent) -> None:
        """Fold one event in (what the follower does with each record)."""
        before = self.endpoints.get(event.endpoint_id)
        after = fold(before, event)
        if after is not before:
            self.endpoints = {**self.endpoints, event.endpoint_id: after}
            self.version += 1

    def start(self) -> None:
        """Follow the topic in a task of the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.follow())

    async def stop(self) -> None:
        """Stop following."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def follow(self) -> None:
        """Read from the beginning, then every new record; survives a broker that goes
        away (logged, tried again) and a topic that does not exist yet (empty registry)."""
        reader = CommittedLog(self._kafka)
        tp = TopicPartition(self._kafka.topic_endpoints, 0)
        assigned = False
        while True:
            try:
                if not reader.started:
                    await reader.start()
                if not assigned:
                    if not await reader.partitions(tp.topic, missing_ok=True):
                        if tp.topic not in self._warned:
                            self._warned.add(tp.topic)
                            log.warning(
                                "no topic %s: no endpoints from the registry (create it with "
                                "'ledger topics create')",
                                tp.topic,
                            )
                        self.caught_up.set()
                        await asyncio.sleep(5)
                        continue
                    reader.assign([tp], {tp: 0})  # from the beginning, every time
                    end = (await reader.ends([tp]))[tp]
                    assigned = True
                    if end == 0:
                        self.caught_up.set()
                for record in (await reader.read(self._poll_ms, 1000)).get(tp, []):
                    event = _decoded(record)
                    if event is None:
                        self.refused += 1
                    else:
                        self.apply(event)
                if not self.caught_up.is_set() and await reader.position(tp) >= end:
                    self.caught_up.set()
            except asyncio.CancelledError:
                await reader.stop()
                raise
            except TRANSIENT as exc:
                log.warning("reading %s: %s (trying again)", tp.topic, exc)
                await reader.stop()
                assigned = False
                await asyncio.sleep(1)

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
