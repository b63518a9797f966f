"""Read a topic from the beginning (read_committed) and yield its decoded events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from events.codec import EventDecodeError, decode
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.settings import Settings
from ledger.errors import LedgerError


@dataclass(frozen=True)
class ReplayedRecord:
    """One record read back: where it was, and the event or the reason it did not decode."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    event: AnyExecutionEvent | AnyDeliveryEvent | None
    error: str | None


@dataclass(frozen=True)
class ReplayFilter:
    """Which events to keep."""

    run_id: str | None = None
    idempotency_key: str | None = None

    def keeps(self, record: ReplayedRecord) -> bool:
        """True when the record passes every filter that is set."""
        event = record.event
        if event is None:
            return self.run_id is None and self.idempotency_key is None
        if self.run_id is not None and event.run_id != self.run_id:
            return False
        if self.idempotency_key is not None:
            return getattr(event, "idempotency_key", None) == self.idempotency_key
        return True


async def replay(
    settings: Settings, topics: list[str], wanted: ReplayFilter | None = None
) -> AsyncIterator[ReplayedRecord]:
    """Every committed record now in ``topics``, from offset 0 to the current end."""
    wanted = wanted or ReplayFilter()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        group_id=None,
    )
    try:
        await consumer.start()
    except KafkaConnectionError:
        await consumer.stop()
        raise LedgerError(
            f"no Kafka broker answers at {settings.bootstrap_servers}",
            "start one with 'ledger broker start'",
        ) from None
    try:
        partitions: list[TopicPartition] = []
        for topic in topics:
            numbers = await _partitions_for(consumer, topic)
            partitions += [TopicPartition(topic, p) for p in sorted(numbers)]
        if not partitions:
            return
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        # The end of a read_committed consumer is the last stable offset.
        ends = await consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > 0}
        for tp in partitions:
            if tp not in remaining:
                consumer.pause(tp)
        while remaining:
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            for tp, messages in batches.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        continue
                    record = _decoded(message)
                    if wanted.keeps(record):
                        yield record
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await consumer.stop()


async def _partitions_for(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    numbers = consumer.partitions_for_topic(topic)
    if numbers is None:
        await consumer._client.force_metadata_update()
        numbers = consumer.partitions_for_topic(topic)
    if numbers is None:
        raise LedgerError(f"topic {topic} does not exist", "create it with 'ledger topics create'")
    return set(numbers)


def _decoded(message: object) -> ReplayedRecord:
    value = getattr(message, "value", None)
    try:
        event = decode(value)
        error = None
    except EventDecodeError as exc:
        event, error = None, exc.reason
    return ReplayedRecord(
        topic=getattr(message, "topic", ""),
        partition=getattr(message, "partition", -1),
        offset=getattr(message, "offset", -1),
        timestamp_ms=getattr(message, "timestamp", 0),
        event=event,
        error=error,
    )
