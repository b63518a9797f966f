"""Reading the ledger topics for a projection: read_committed, manual assignment, our offsets.

A projection owns its offsets (they live in its database, committed with its rows), so
it never joins a consumer group: it assigns every partition of both topics itself and
seeks to where its last committed batch ended.
"""

from __future__ import annotations

from collections.abc import Collection
from types import TracebackType
from typing import Self

from aiokafka import TopicPartition
from aiokafka.errors import OffsetOutOfRangeError

from clients.committed_log import CommittedLog
from clients.outcome_keys import require_outcome_keys, verifier_for
from config.settings import Settings
from events.base import Event
from events.budgets import BudgetEvent
from events.endpoints import EndpointEvent
from events.errors import LedgerError
from events.model import DeliveryEvent, ExecutionEvent
from projections.records import LogRecord, decode_at
from projections.store import Offsets


class LogReader:
    """Batches of decoded records from ``ledger.runs``, ``ledger.deliveries``, the endpoint
    registry and the budgets."""

    def __init__(self, settings: Settings, *, batch_size: int = 5000) -> None:
        """``batch_size`` caps the records one ``read`` returns."""
        # Every folding reader (projector, rebuild, verify) checks outcome signatures.
        require_outcome_keys(settings, signs=False)
        self._settings = settings
        self._verifier = verifier_for(settings)
        self._batch_size = batch_size
        # Never jump silently: an offset the log no longer has is an error (below).
        self._log = CommittedLog(settings.kafka, reset="none", large_fetches=True)
        self.partitions: list[TopicPartition] = []
        self.start_offsets: Offsets = {}
        kafka = settings.kafka
        # The kind of event each topic holds.
        self._holds: dict[str, type[Event]] = {
            kafka.topic_runs: ExecutionEvent,
            kafka.topic_deliveries: DeliveryEvent,
            kafka.topic_endpoints: EndpointEvent,
            kafka.topic_budgets: BudgetEvent,
        }

    async def start(
        self, offsets: Offsets, only: Collection[tuple[str, int]] | None = None
    ) -> None:
        """Connect, assign every partition of both topics (or those in ``only``: a parallel
        rebuild's worker reads its share), seek to ``offsets`` (else 0)."""
        await self._log.start()
        kafka = self._settings.kafka
        optional = (kafka.topic_endpoints, kafka.topic_budgets)
        for topic in (kafka.topic_runs, kafka.topic_deliveries, *optional):
            # The endpoint registry and the budgets are optional: an installation from
            # before them has neither.
            found = await self._log.partitions(topic, missing_ok=topic in optional)
            if only is not None:
                found = [tp for tp in found if (tp.topic, tp.partition) in only]
            self.partitions += found
        starts = {tp: offsets.get((tp.topic, tp.partition), 0) for tp in self.partitions}
        self.start_offsets = {(tp.topic, tp.partition): o for tp, o in starts.items()}
        self._log.assign(self.partitions, starts)
        # Stored offsets of a partition that no longer exists are beyond its end (0) too.
        ours = {p: o for p, o in offsets.items() if p[0] in {tp.topic for tp in self.partitions}}
        self.check_within({**ours, **self.start_offsets}, await self.end_offsets())

    def seek(self, offsets: Offsets) -> None:
        """Read every partition from ``offsets`` (else 0) again: after a batch was rolled
        back, from the offsets the database holds."""
        self._log.seek({tp: offsets.get((tp.topic, tp.partition), 0) for tp in self.partitions})

    def check_within(self, offsets: Offsets, ends: Offsets) -> None:
        """Raise a one-line ``LedgerError`` if an offset lies beyond its partition's end.

        A projection's stored offsets (or the offsets a verify rebuilds to) can only be
        past the end when the topics were deleted and recreated: reading on would skip
        the new records silently, or wait forever for offsets that never come.
        """
        for (topic, partition), offset in sorted(offsets.items()):
            end = ends.get((topic, partition), 0)
            if offset > end:
                raise beyond_end(topic, partition, offset, end)

    async def end_offsets(self) -> Offsets:
        """The last stable offset of every partition, now."""
        ends = await self._log.ends(self.partitions)
        return {(tp.topic, tp.partition): ends[tp] for tp in self.partitions}

    async def positions(self) -> Offsets:
        """The next offset this reader will return, per partition."""
        return {(tp.topic, tp.partition): await self._log.position(tp) for tp in self.partitions}

    async def read(self, timeout_ms: int, until: Offsets | None = None) -> list[LogRecord]:
        """The next records (possibly none), decoded; none at or past ``until``."""
        try:
            fetched = await self._log.read(timeout_ms=timeout_ms, max_records=self._batch_size)
        except OffsetOutOfRangeError as exc:
            # Recreated while we were reading: the same one line as at start.
            raise await self._out_of_range(exc) from None
        records: list[LogRecord] = []
        for tp in sorted(fetched, key=lambda t: (t.topic, t.partition)):
            limit = None if until is None else until.get((tp.topic, tp.partition), 0)
            for message in fetched[tp]:
                if limit is not None and message.offset >= limit:
                    # Past the end we were asked for: stop fetching this partition.
                    self._log.pause(tp)
                    break
                records.append(
                    decode_at(
                        tp.topic,
                        tp.partition,
                        message.offset,
                        message.value,
                        message.key,
                        self._holds[tp.topic],
                        self._verifier,
                        message.headers,
                    )
                )
        return records

    async def reached(self, until: Offsets) -> bool:
        """True when every partition has been read up to ``until``."""
        positions = await self.positions()
        return all(positions[p] >= until.get(p, 0) for p in positions)

    async def stop(self) -> None:
        """Disconnect."""
        await self._log.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _out_of_range(self, exc: OffsetOutOfRangeError) -> LedgerError:
        where = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        ends = await self.end_offsets()
        for tp, offset in where.items():
            return beyond_end(tp.topic, tp.partition, offset, ends.get((tp.topic, tp.partition), 0))
        return beyond_end("a ledger topic", -1, -1, -1)


def beyond_end(topic: str, partition: int, offset: int, end: int) -> LedgerError:
    """The error for a projection that has read further than the log now reaches."""
    return LedgerError(
        f"the projection has read {topic}[{partition}] up to offset {offset}, but the log "
        f"ends at {end}: the topics were recreated (or truncated) since it was built",
        "rebuild it from the log: ledger rebuild --into DSN --replace",
    )
