"""Read topics (read_committed) from a start offset to their current end, decoded and filtered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from aiokafka import TopicPartition

from clients.committed_log import CommittedLog
from config.settings import Settings
from events.codec import EventDecodeError, decode
from events.deadletter import DeadLetter
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.refusal import Refuser, refusal
from ledger.errors import UsageError

# Called as records are read (kept or not): (records read so far, records to read).
ReplayProgress = Callable[[int, int], None]


@dataclass(frozen=True)
class ReplayedRecord:
    """One record read back: where it was, and the event or the reason it did not decode."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    event: AnyExecutionEvent | AnyDeliveryEvent | None
    error: str | None
    # A record of ``ledger.deadletter``: what could not be used, where it was, and why.
    deadletter: DeadLetter | None = None

    @property
    def occurred_at(self) -> datetime:
        """The event's time (or the dead letter's), else the broker's record time."""
        if self.event is not None:
            return self.event.occurred_at
        if self.deadletter is not None:
            return self.deadletter.occurred_at
        return datetime.fromtimestamp(self.timestamp_ms / 1000, UTC)


@dataclass(frozen=True)
class ReplayFilter:
    """Which records to read (offsets, partitions) and which of them to keep (the rest).

    Offsets bound the read itself, per partition: ``from_offset`` inclusive, ``to_offset``
    exclusive. Times compare with the event's ``occurred_at``: ``since`` inclusive,
    ``until`` exclusive. Undecodable records pass only filters they cannot fail.
    """

    run_id: str | None = None
    idempotency_key: str | None = None
    event_types: frozenset[str] = frozenset()
    since: datetime | None = None
    until: datetime | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    partitions: frozenset[int] = frozenset()

    def keeps(self, record: ReplayedRecord) -> bool:
        """True when the record passes every filter that is set."""
        at = record.occurred_at
        if (self.since is not None and at < self.since) or (
            self.until is not None and at >= self.until
        ):
            return False
        event = record.event
        if event is None:
            return self.run_id is None and self.idempotency_key is None and not self.event_types
        if self.event_types and event.type not in self.event_types:
            return False
        if self.run_id is not None and event.run_id != self.run_id:
            return False
        if self.idempotency_key is not None:
            return getattr(event, "idempotency_key", None) == self.idempotency_key
        return True


async def replay(
    settings: Settings,
    topics: list[str],
    wanted: ReplayFilter | None = None,
    progress: ReplayProgress | None = None,
) -> AsyncIterator[ReplayedRecord]:
    """Every committed record now in ``topics`` within the filter's offsets, in order per
    partition, up to the end as it was when the replay started."""
    wanted = wanted or ReplayFilter()
    async with CommittedLog(settings.kafka, large_fetches=True) as reader:
        everything = [tp for topic in topics for tp in await reader.partitions(topic)]
        _check_partitions(wanted.partitions, everything)
        partitions = [
            tp for tp in everything if not wanted.partitions or tp.partition in wanted.partitions
        ]
        if not partitions:
            return
        # The end of a read_committed reader is the last stable offset.
        ends = await reader.ends(partitions)
        starts = await reader.beginnings(partitions)
        for tp in partitions:
            starts[tp] = max(starts[tp], wanted.from_offset or 0)
            if wanted.to_offset is not None:
                ends[tp] = min(ends[tp], wanted.to_offset)
        reader.assign(partitions, starts)
        total = sum(max(0, ends[tp] - starts[tp]) for tp in partitions)
        read = 0
        remaining = {tp for tp in partitions if ends[tp] > starts[tp]}
        for tp in partitions:
            if tp not in remaining:
                reader.pause(tp)
        while remaining:
            batches = await reader.read(timeout_ms=1000, max_records=5000)
            for tp, messages in batches.items():
                for message in messages:
                    if message.offset >= ends[tp]:
                        continue
                    read += 1
                    try:
                        record = _decoded(message)
                        kept = wanted.keeps(record)
                    except Exception as exc:  # noqa: BLE001 - the record guard
                        record = refused(_undecoded(message), exc)
                        kept = wanted.keeps(record)
                    if kept:
                        yield record
            for tp in list(remaining):
                if await reader.position(tp) >= ends[tp]:
                    remaining.discard(tp)
                    reader.pause(tp)
            if progress is not None:
                # Offsets, not records, bound the total (commit markers take offsets too).
                progress(read, max(total, read) if remaining else read)


def _check_partitions(asked: frozenset[int], existing: list[TopicPartition]) -> None:
    """Refuse (``UsageError``) a partition that none of the topics has."""
    numbers = {tp.partition for tp in existing}
    missing = sorted(asked - numbers)
    if missing and numbers:
        counts = ", ".join(
            f"{topic} has {sum(1 for tp in existing if tp.topic == topic)}"
            for topic in dict.fromkeys(tp.topic for tp in existing)
        )
        raise UsageError(
            f"partition {missing[0]} does not exist ({counts})",
            f"partitions are numbered from 0 to {max(numbers)}",
        )


def refused(record: ReplayedRecord, exc: BaseException) -> ReplayedRecord:
    """``record`` shown as one the replay could not use, with the one-line reason (the
    record guard: a record that cannot be read or shown never ends a replay)."""
    reason = refusal(Refuser.REPLAY, record.topic, record.partition, record.offset, exc)
    return replace(record, event=None, error=reason, deadletter=None)


def _undecoded(message: object) -> ReplayedRecord:
    return ReplayedRecord(
        topic=getattr(message, "topic", ""),
        partition=getattr(message, "partition", -1),
        offset=getattr(message, "offset", -1),
        timestamp_ms=getattr(message, "timestamp", 0),
        event=None,
        error=None,
    )


def _decoded(message: object) -> ReplayedRecord:
    value = getattr(message, "value", None)
    try:
        return replace(_undecoded(message), event=decode(value))
    except EventDecodeError as exc:
        deadletter = _deadletter(value)
        error = None if deadletter is not None else exc.reason
        return replace(_undecoded(message), error=error, deadletter=deadletter)


def _deadletter(value: object) -> DeadLetter | None:
    """``value`` read as a dead letter, or None when it is not one."""
    if not isinstance(value, bytes) or b'"deadletter"' not in value:
        return None
    try:
        return DeadLetter.model_validate_json(value)
    except ValueError:
        return None
