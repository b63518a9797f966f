"""Acting on agents' send budgets as an operator: read ``ledger.budgets``, append signed
budget events (events/budgets.py). Shared by ``ledger budgets`` (and, later, the
dashboard). What the workers hold is the fold of the same topic, read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from clients.aiokafka_internals import refresh_metadata
from clients.kafka_security import (
    NOT_AUTHORIZED,
    client_options,
    connect_error,
    not_allowed,
)
from clients.outcome_keys import operator_signer_for, verifier_for
from clients.signed_log import SignedLog
from config.settings import Settings
from events.budgets import (
    BudgetBook,
    BudgetDecodeError,
    BudgetOperatorEvent,
    decode_budget_record,
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
    are not budget events, or not signed as they must be, are skipped (counted) by the
    rule the workers apply (the live projector dead-letters them)."""
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
                        event = decode_budget_record(m.value, m.key)
                    except BudgetDecodeError:
                        refused += 1
                        continue
                    headers = [(str(k), bytes(v or b"")) for k, v in m.headers or ()]
                    if verifier is not None and verifier.refuses(event, m.value, headers):
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


class BudgetActions(SignedLog[BudgetOperatorEvent]):
    """Appends signed operator budget events to ``ledger.budgets`` (idempotent producer,
    acks from all in-sync replicas): ``async with BudgetActions(settings) as log``."""

    def __init__(self, settings: Settings) -> None:
        topic = settings.kafka.topic_budgets
        signer = operator_signer_for(settings)
        super().__init__(settings, topic, signer, encode_budget, record_key)
