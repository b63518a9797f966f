"""Appends made beside the agent, not from a record: send outcomes and timer decisions.

An idempotent producer (acks=all); each append waits until the broker has the records,
so an outcome is durable before the sender forgets it. The state machine treats these
as at-least-once input (dedupe by event_id, fencing tokens).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from clients.kafka_security import client_options
from clients.outcome_keys import signer_for
from config.settings import Settings
from events.base import Event
from events.codec import encode
from events.topics import record_key
from streams.own_records import OwnRecords


class OutcomeProducer:
    """Lazily started idempotent producer to ``ledger.deliveries`` (at-least-once)."""

    def __init__(self, settings: Settings, own: OwnRecords | None = None) -> None:
        self._settings = settings
        # What this worker appends, for its processor to take back without decoding.
        self._own = own
        self._signer = signer_for(settings)
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self.appended = 0

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._settings.kafka.bootstrap_servers,
                    enable_idempotence=True,
                    acks="all",
                    linger_ms=self._settings.worker.linger_s * 1000,
                    **client_options(self._settings.kafka),
                )
                await producer.start()
                self._producer = producer
            return self._producer

    async def append(self, events: Sequence[Event]) -> None:
        """Write ``events`` in order, keyed by idempotency key; return when acknowledged."""
        if not events:
            return
        producer = await self._started()
        topic = self._settings.kafka.topic_deliveries
        futures = []
        for event in events:
            value = encode(event)
            headers = None if self._signer is None else self._signer.headers(value)
            if self._own is not None:
                self._own.remember(value, event, headers)
            futures.append(
                await producer.send(topic, value, key=record_key(event), headers=headers)  # type: ignore[arg-type]
            )
        await asyncio.gather(*futures)
        self.appended += len(events)

    async def stop(self) -> None:
        """Flush and close."""
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
