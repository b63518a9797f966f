"""Offset continuity: notice records the stream skipped, and hand them back in order.

faust-streaming has been seen to commit past records it never gave the agent (after a
SIGKILL or a rebalance; faust-streaming #221/#606, and our own trial). For a delivery
ledger a skipped ``DeliveryRequested`` is a silently lost notification, so the agent checks
every offset jump against a second, read_committed reader of the same partition. Jumps
are normal (transaction markers, aborted records): the reader then finds nothing. The
agent only notes jumps; a timer verifies them in the background, one fetch per
partition for all of its jumps, and what it finds is processed with that partition's
next record (the table can only be written in a record's context).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from streams.processor import Record

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 15.0
COORDINATOR_RETRIES = 20


class ContinuityGuard:
    """Per partition: the last offset processed, and a read-ahead window of committed records."""

    def __init__(self, bootstrap_servers: str, topic: str, group_id: str) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._group = group_id
        self._last: dict[int, int] = {}
        self._gaps: dict[int, list[tuple[int, int]]] = {}
        self._found: dict[int, list[Record]] = {}
        self._reader: AIOKafkaConsumer | None = None
        self.recovered = 0

    async def on_assigned(self, partitions: Iterable[int]) -> None:
        """Start each newly owned partition's check at the group's committed offset."""
        wanted = [TopicPartition(self._topic, p) for p in partitions]
        self._last.clear()
        self._gaps.clear()
        self._found.clear()
        if not wanted:
            return
        committed = await self._committed(wanted)
        for tp in wanted:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else 0
            self._last[tp.partition] = offset - 1

    async def _committed(self, wanted: list[TopicPartition]) -> dict[TopicPartition, Any]:
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
        await admin.start()
        try:
            for attempt in range(COORDINATOR_RETRIES):
                try:
                    found: dict[TopicPartition, Any] = await admin.list_consumer_group_offsets(
                        self._group, partitions=wanted
                    )
                    return found
                except KafkaError as exc:
                    # A new cluster or group may not have a coordinator for a moment.
                    if not exc.retriable or attempt == COORDINATOR_RETRIES - 1:
                        raise
                    await asyncio.sleep(0.5)
            raise AssertionError("unreachable")
        finally:
            await admin.close()

    def last_processed(self, partition: int) -> int | None:
        """The highest offset handed to the agent in ``partition`` (None before any)."""
        return self._last.get(partition)

    def note(self, partition: int, offset: int) -> None:
        """The agent is about to process ``offset``: remember any jump for verification.

        Cheap and never blocking: checking a jump needs a fetch, which would put a broker
        round trip (sometimes a fetch wait) in front of every record after a transaction
        marker. ``verify`` checks the noted jumps in the background instead.
        """
        last = self._last.get(partition)
        self._last[partition] = max(offset, last if last is not None else offset)
        if last is not None and offset > last + 1:
            self._gaps.setdefault(partition, []).append((last + 1, offset))

    def take_recovered(self, partition: int) -> list[Record]:
        """Skipped committed records found in ``partition``, to process now (usually none)."""
        return self._found.pop(partition, [])

    @property
    def pending(self) -> int:
        """Jumps noted and not verified yet."""
        return sum(len(gaps) for gaps in self._gaps.values())

    async def verify(self) -> int:
        """Check every noted jump: one fetch per partition covers all of its jumps."""
        gaps, self._gaps = self._gaps, {}
        found = 0
        for partition, ranges in gaps.items():
            start = min(a for a, _ in ranges)
            end = max(b for _, b in ranges)
            window = await self._fetch(partition, start, end)
            missed = [
                record
                for a, b in ranges
                for offset in range(a, b)
                if (record := window[2].get(offset)) is not None
            ]
            if missed:
                found += len(missed)
                self.recovered += len(missed)
                self._found.setdefault(partition, []).extend(missed)
                log.error(
                    "the stream skipped %d committed record(s) in partition %d; they are "
                    "processed with the partition's next record",
                    len(missed),
                    partition,
                )
        return found

    async def _fetch(
        self, partition: int, start: int, end: int
    ) -> tuple[int, int, dict[int, Record]]:
        reader = await self._started()
        tp = TopicPartition(self._topic, partition)
        reader.assign([tp])
        reader.seek(tp, start)
        records: dict[int, Record] = {}
        deadline = time.monotonic() + READ_TIMEOUT_S
        position = start
        while position < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not re-read {self._topic}[{partition}] {start}..{end}")
            batch = await reader.getmany(tp, timeout_ms=500, max_records=2000)
            for message in batch.get(tp, []):
                records[message.offset] = Record(
                    topic=message.topic,
                    partition=message.partition,
                    offset=message.offset,
                    key=message.key,
                    value=message.value,
                )
            position = await reader.position(tp)
        return start, position, records

    async def _started(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest",
            )
            await reader.start()
            self._reader = reader
        return self._reader

    async def stop(self) -> None:
        """Close the side reader."""
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None
