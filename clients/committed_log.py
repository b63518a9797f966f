"""Reading what the log has committed, outside any consumer group.

Every reader of the ledger topics that is not the worker itself (the projector, the
metrics scrape, ``ledger replay``, the demo's observer, the worker's continuity guard)
reads the same way: ``read_committed`` (an aborted or open transaction is never read),
no consumer group and no auto-commit (a reader owns its offsets, or needs none), and
partitions assigned by hand. ``CommittedLog`` is that reader, once: it also turns a broker
that does not answer, or a topic that does not exist, into a ``LedgerError`` with a hint.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Literal, Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError

from clients.aiokafka_internals import refresh_metadata
from clients.kafka_security import client_options, connect_error
from config.parts import KafkaSettings
from events.errors import LedgerError

# What a read can fail with that a later try may not (a broker restarting, a rebalance):
# long-running readers log these and try again, they never stop on them.
TRANSIENT = (KafkaError, TimeoutError, LedgerError)


class CommittedLog:
    """A read_committed, group-less reader of partitions it assigns itself."""

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        reset: Literal["earliest", "none"] = "earliest",
        large_fetches: bool = False,
        request_timeout_ms: int = 40_000,
    ) -> None:
        """``reset="none"`` makes an offset the log no longer has an error instead of a
        silent jump (aiokafka's OffsetOutOfRangeError); ``large_fetches`` for readers
        that go through whole topics."""
        self.settings = settings
        self.bootstrap_servers = settings.bootstrap_servers
        fetch: dict[str, Any] = (
            {"max_partition_fetch_bytes": 4 * 1024 * 1024, "fetch_max_bytes": 64 * 1024 * 1024}
            if large_fetches
            else {}
        )
        self._options: dict[str, Any] = {
            "isolation_level": "read_committed",
            "enable_auto_commit": False,
            "group_id": None,
            "auto_offset_reset": reset,
            "request_timeout_ms": request_timeout_ms,
            **fetch,
            **client_options(settings),
        }
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> Self:
        """Connect; a ``LedgerError`` if no broker answers or it refuses us."""
        if self._consumer is not None:
            return self
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, **self._options)
        try:
            await consumer.start()
        except KafkaConnectionError:
            await consumer.stop()
            raise await connect_error(self.settings) from None
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        return self

    @property
    def started(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._consumer is not None

    async def partitions(self, topic: str, *, missing_ok: bool = False) -> list[TopicPartition]:
        """Every partition of ``topic``; a ``LedgerError`` if it does not exist (or none
        with ``missing_ok``)."""
        consumer = self._live()
        numbers = consumer.partitions_for_topic(topic)
        if numbers is None:
            # Metadata is fetched for subscribed topics only: ask for this one.
            await refresh_metadata(consumer)
            numbers = consumer.partitions_for_topic(topic)
        if numbers is None:
            if missing_ok:
                return []
            raise LedgerError(
                f"topic {topic} does not exist", "create it with 'ledger topics create'"
            )
        return [TopicPartition(topic, n) for n in sorted(numbers)]

    def assign(
        self, partitions: Iterable[TopicPartition], start: dict[TopicPartition, int]
    ) -> None:
        """Read ``partitions`` (only those) from the offsets in ``start``."""
        consumer = self._live()
        wanted = list(partitions)
        consumer.assign(wanted)
        for tp in wanted:
            consumer.seek(tp, start[tp])

    def seek(self, start: dict[TopicPartition, int]) -> None:
        """Read each partition of ``start`` from its offset again (records already fetched
        past it are dropped): a projector that rolled a batch back re-reads it."""
        consumer = self._live()
        for tp, offset in start.items():
            consumer.seek(tp, offset)

    def pause(self, tp: TopicPartition) -> None:
        """Fetch nothing more from ``tp`` (it has been read as far as wanted)."""
        self._live().pause(tp)

    async def ends(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's end as this reader sees it: the last stable offset."""
        found = await self._live().end_offsets(list(partitions))
        return {tp: int(offset) for tp, offset in found.items()}

    async def beginnings(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Each partition's first offset still in the log (after retention)."""
        found = await self._live().beginning_offsets(list(partitions))
        return {tp: int(offset) for tp, offset in found.items()}

    async def position(self, tp: TopicPartition) -> int:
        """The next offset this reader will return from ``tp``."""
        return int(await self._live().position(tp))

    async def read(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        """The next records of the assigned partitions (possibly none), per partition."""
        batches: dict[TopicPartition, list[Any]] = await self._live().getmany(
            timeout_ms=timeout_ms, max_records=max_records
        )
        return batches

    async def offsets_in(
        self, tp: TopicPartition, start: int, end: int, timeout_s: float
    ) -> set[int]:
        """The offsets of the committed records in ``[start, end)`` of ``tp`` (markers and
        aborted records take offsets but are not records). Assigns ``tp`` alone."""
        self.assign([tp], {tp: start})
        offsets: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while await self.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not re-read {tp.topic}[{tp.partition}] {start}..{end}")
            batch = await self.read(timeout_ms=500, max_records=2000)
            offsets.update(r.offset for r in batch.get(tp, []) if r.offset < end)
        return offsets

    async def stop(self) -> None:
        """Disconnect (``start`` connects again)."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _live(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("CommittedLog.start() was not called")
        return self._consumer
