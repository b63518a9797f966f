"""Acting on agents' send budgets as an operator: read ``ledger.budgets``, append signed
budget events (events/budgets.py). Shared by ``ledger budgets`` (and, later, the
dashboard). What the workers hold is the fold of the same topic, read the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from clients.aiokafka_internals import refresh_metadata
from clients.kafka_security import (
    NOT_AUTHORIZED,
    client_options,
    connect_error,
    not_allowed,
    start_producer,
)
from clients.outcome_keys import operator_signer_for, verifier_for
from clients.outcome_signing import OutcomeSigner
from config.settings import Settings
from events.budgets import (
    BudgetBook,
    BudgetDecodeError,
    BudgetOperatorEvent,
    decode_budget,
    encode_budget,
    record_key,
)
from events.errors import LedgerError

PRODUCER = "ledger-operator"
READ_ROUNDS = 400


@dataclass
class ReadBook:
    """The fold of the whole budgets topic as of now, and how many records it skipped."""

    book: BudgetBook
    refused: int
    topic_exists: bool


async def read_book(settings: Settings) -> ReadBook:
    """Read ``ledger.budgets`` from its start to its current end and fold it; records that
    are not budget events, or not signed as they must be, are skipped (counted)."""
    topic = settings.kafka.topic_budgets
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **client_options(settings.kafka),
    )
    try:
        await consumer.start()
    except KafkaConnectionError:
        await consumer.stop()
        raise await connect_error(settings.kafka) from None
    verifier = verifier_for(settings)
    book, refused = BudgetBook(), 0
    try:
        await refresh_metadata(consumer, (topic,))
        numbers = consumer.partitions_for_topic(topic) or set()
        parts = [TopicPartition(topic, n) for n in sorted(numbers)]
        if not parts:
            return ReadBook(book, 0, topic_exists=False)
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        for _ in range(READ_ROUNDS):
            positions = [await consumer.position(tp) for tp in parts]
            if all(p >= ends[tp] for p, tp in zip(positions, parts, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=500)
            for tp, messages in batch.items():
                for m in messages:
                    if m.offset >= ends[tp]:
                        continue
                    try:
                        event = decode_budget(m.value)
                    except BudgetDecodeError:
                        refused += 1
                        continue
                    headers = [(str(k), bytes(v or b"")) for k, v in m.headers or ()]
                    if m.key != record_key(event) or (
                        verifier is not None and verifier.refuses(event, m.value, headers)
                    ):
                        refused += 1
                        continue
                    book.apply(event)
        else:
            raise LedgerError(f"could not read {topic} to its end", "is the broker busy? try again")
    except NOT_AUTHORIZED as exc:
        raise not_allowed(settings.kafka, exc) from None
    finally:
        await consumer.stop()
    return ReadBook(book, refused, topic_exists=True)


class BudgetActions:
    """Appends signed operator budget events to ``ledger.budgets`` (idempotent producer,
    acks from all in-sync replicas): ``async with BudgetActions(settings) as log``."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._signer: OutcomeSigner | None = operator_signer_for(settings)
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Self:
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.kafka.bootstrap_servers,
            enable_idempotence=True,
            acks="all",
            **client_options(self._settings.kafka),
        )
        await start_producer(producer, self._settings.kafka)
        self._producer = producer
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def append(self, events: Sequence[BudgetOperatorEvent]) -> None:
        """Write ``events`` in order, each signed, keyed by agent; return when acknowledged."""
        assert self._producer is not None, "use BudgetActions as 'async with'"
        topic = self._settings.kafka.topic_budgets
        futures = []
        for event in events:
            value = encode_budget(event)
            headers = None if self._signer is None else self._signer.headers(value)
            futures.append(
                await self._producer.send(topic, value, key=record_key(event), headers=headers)
            )
        await asyncio.gather(*futures)
