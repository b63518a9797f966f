"""Offset continuity: notice records the stream skipped, and have the stream read them again.

faust-streaming has been seen to commit past records it never gave the agent (after a
SIGKILL or a rebalance; faust-streaming #221/#606, and our own trial). For a delivery
ledger a skipped ``DeliveryRequested`` is a silently lost notification, so the agent checks
every offset jump against a second, read_committed reader of the same partition. Jumps
are normal (transaction markers, aborted records): the reader then finds nothing. The
agent only notes jumps; a timer verifies them in the background, one fetch per
partition for all of its jumps. Skipped committed records are handled by rewinding the
stream to the first of them (the table can only be written from the stream), at once,
not when a later record happens to arrive; the fold dedupes what is read twice. A gap is
forgotten only once each of its records has been handled.

A stream can also stop short of the partition's end without any jump to note (a new owner
that is never handed the records past its committed offset: seen in the demo after a
SIGKILL, two requests left PENDING for good). So the tail is checked too: when committed
records lie past the last processed offset and the stream has not moved on that partition
for TAIL_PATIENCE_S, the rest of the partition is verified like a jump.

What was verified survives the worker: the guard commits, per partition, the offset
below which every record was handled to a consumer group of its own
(``<worker group>.continuity``). A new owner of a partition starts its check there, not
at the worker group's committed offset, so a skip followed by a crash is re-read too.
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

from clients.committed_log import TRANSIENT, CommittedLog
from clients.kafka_security import client_options
from config.settings import Settings

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 15.0
COORDINATOR_RETRIES = 20
# A rewound record not seen again within this long is asked for again, up to MAX_REWINDS.
REWIND_PATIENCE_S = 10.0
MAX_REWINDS = 5
# A partition with committed records past the last processed offset and no progress for
# this long has its tail verified (and the stream rewound if records are there).
TAIL_PATIENCE_S = 5.0
CATCH_UP_PATIENCE_S = 1.0


class ContinuityGuard:
    """Per partition: the last offset processed, jumps to verify, records awaited again."""

    def __init__(self, settings: Settings, topic: str, group_id: str) -> None:
        self._settings = settings
        self._topic = topic
        self._group = group_id
        self.marks_group = f"{group_id}.continuity"
        self._last: dict[int, int] = {}
        self._gaps: dict[int, list[tuple[int, int]]] = {}
        # Skipped records asked for again: offset -> (when to ask again, rewinds so far).
        self._awaiting: dict[int, dict[int, tuple[float, int]]] = {}
        self._rewinds: dict[int, int] = {}
        # When the stream last moved on a partition (monotonic), and tails being verified.
        self._moved_at: dict[int, float] = {}
        self._tails: dict[int, int] = {}
        # Newly assigned partitions: the committed end at assignment, until the stream has
        # read up to it. Timers act on a partition only once it caught up (``continuous``).
        self._catch_up: dict[int, int] = {}
        # Bumped by every assignment: a check that awaited the broker across a rebalance
        # drops what it read, since the state it was reading for has been reset.
        self._epoch = 0
        self._log = CommittedLog(settings.kafka)
        self._marker: AIOKafkaConsumer | None = None
        self.recovered = 0
        self.given_up = 0

    async def on_assigned(self, partitions: Iterable[int]) -> None:
        """Start each owned partition's check at its last verified offset.

        That is the guard group's mark when it is behind the worker group's committed
        offset (the previous owner died before verifying), or this process's own last
        offset when another worker processed the partition in between: the records in
        between are checked and re-read.
        """
        wanted = [TopicPartition(self._topic, p) for p in partitions]
        # What this process had processed before the rebalance: a partition it owned before
        # and owns again may have been another worker's in between (this one paused past
        # its session); faust does not recover a partition it sees as kept, so the table
        # lacks the other's records unless the stream reads them again.
        before = dict(self._last)
        self._epoch += 1
        self._last.clear()
        self._gaps.clear()
        self._awaiting.clear()
        self._rewinds.clear()
        self._moved_at.clear()
        self._tails.clear()
        self._catch_up.clear()
        if not wanted:
            return
        committed = await self._committed(self._group, wanted)
        marks = await self._committed(self.marks_group, wanted)
        for tp in wanted:
            start = _offset(committed.get(tp))
            self._last[tp.partition] = start - 1
            self._moved_at[tp.partition] = time.monotonic()
            mark = _offset(marks.get(tp)) if tp in marks else None
            own = before.get(tp.partition)
            if own is not None and own + 1 < start:
                mark = own + 1 if mark is None else min(mark, own + 1)
            if mark is not None and mark < start:
                self._gaps.setdefault(tp.partition, []).append((mark, start))
        try:
            ends = await (await self._log.start()).ends(wanted)
        except TRANSIENT as exc:
            # Not known yet: each partition waits until the tail check has seen its end.
            log.warning("could not read the partitions' ends on assignment: %s", exc)
            ends = {tp: self._last[tp.partition] + 2 for tp in wanted}
        for tp, end in ends.items():
            if end > self._last[tp.partition] + 1:
                self._catch_up[tp.partition] = end

    def continuous(self, partition: int) -> bool:
        """True when the state of ``partition`` follows the log in order as far as anyone
        can tell: caught up since assignment, no jump unverified, no skipped record
        waiting. A decision from a state that lacks earlier records (a claim under a token
        another worker already holds) would be a second send."""
        if partition not in self._last:
            return False  # assignment still being read
        end = self._catch_up.get(partition)
        if end is not None:
            if self._last.get(partition, -1) < end - 1:
                return False
            del self._catch_up[partition]
        return not (
            self._gaps.get(partition) or self._awaiting.get(partition) or partition in self._tails
        )

    async def _committed(
        self, group: str, wanted: list[TopicPartition]
    ) -> dict[TopicPartition, Any]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._settings.kafka.bootstrap_servers,
            **client_options(self._settings.kafka),
        )
        await admin.start()
        try:
            for attempt in range(COORDINATOR_RETRIES):
                try:
                    found: dict[TopicPartition, Any] = await admin.list_consumer_group_offsets(
                        group, partitions=wanted
                    )
                    return {
                        tp: meta
                        for tp, meta in found.items()
                        if meta is not None and meta.offset >= 0
                    }
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
        awaited = self._awaiting.get(partition)
        if awaited and awaited.pop(offset, None) is not None:
            self.recovered += 1
        last = self._last.get(partition)
        self._last[partition] = max(offset, last if last is not None else offset)
        self._moved_at[partition] = time.monotonic()
        if last is not None and offset > last + 1:
            self._gaps.setdefault(partition, []).append((last + 1, offset))

    @property
    def pending(self) -> int:
        """Jumps not verified yet, and skipped records not handled yet."""
        gaps = sum(len(g) for g in self._gaps.values()) + len(self._tails)
        return gaps + sum(len(a) for a in self._awaiting.values())

    def verified(self, partition: int) -> int | None:
        """The offset below which every committed record of ``partition`` was handled."""
        last = self._last.get(partition)
        if last is None:
            return None
        floor = last + 1
        for start, _ in self._gaps.get(partition, []):
            floor = min(floor, start)
        for offset in self._awaiting.get(partition, {}):
            floor = min(floor, offset)
        return floor

    def take_rewinds(self, now: float | None = None) -> dict[int, int]:
        """Partitions whose stream must read again from an offset (then forgotten here).

        Includes skipped records asked for before and still not seen: each is asked for
        up to MAX_REWINDS times, then given up loudly (counted in ``given_up``).
        """
        now = time.monotonic() if now is None else now
        for partition, awaited in self._awaiting.items():
            for offset, (again_at, tries) in list(awaited.items()):
                if now < again_at:
                    continue
                if tries >= MAX_REWINDS:
                    del awaited[offset]
                    self.given_up += 1
                    log.critical(
                        "%s[%d]@%d was skipped and not re-read after %d rewinds",
                        self._topic,
                        partition,
                        offset,
                        tries,
                    )
                    continue
                awaited[offset] = (now + REWIND_PATIENCE_S, tries + 1)
                self._want(partition, offset)
        rewinds, self._rewinds = self._rewinds, {}
        return rewinds

    def _want(self, partition: int, offset: int) -> None:
        self._rewinds[partition] = min(offset, self._rewinds.get(partition, offset))

    async def check_tails(self, partitions: Iterable[int], now: float | None = None) -> int:
        """Note as a gap the committed tail of each partition the stream has stopped short
        of for TAIL_PATIENCE_S; returns how many tails were noted (``verify`` checks them).

        One ListOffsets request for the stalled partitions; under read_committed it
        answers the last stable offset, so an open transaction is not waited for.
        """
        now = time.monotonic() if now is None else now
        stalled = [
            p
            for p in partitions
            if p in self._last
            and p not in self._tails
            and not self._awaiting.get(p)
            and now - self._moved_at.get(p, now) >= self._patience(p)
        ]
        if not stalled:
            return 0
        epoch = self._epoch
        ends = await (await self._log.start()).ends(
            [TopicPartition(self._topic, p) for p in stalled]
        )
        if epoch != self._epoch:
            return 0  # reassigned meanwhile: the new assignment is checked from scratch
        noted = 0
        for tp, end in ends.items():
            partition = tp.partition
            self._moved_at[partition] = now  # look again after another patience period
            last = self._last[partition]
            if end > last + 1:
                self._tails[partition] = end
                noted += 1
            else:
                self._catch_up.pop(partition, None)  # the stream is at the end
        return noted

    def _patience(self, partition: int) -> float:
        # A partition still catching up holds its timers back: check its end sooner.
        return CATCH_UP_PATIENCE_S if partition in self._catch_up else TAIL_PATIENCE_S

    async def verify(self) -> int:
        """Check every noted jump (one fetch per partition); returns skipped records found."""
        gaps, self._gaps = self._gaps, {}
        tails, self._tails = self._tails, {}
        epoch = self._epoch
        found = 0
        for partition in sorted(set(gaps) | set(tails)):
            if epoch != self._epoch:
                return found  # reassigned while reading: on_assigned reset every check
            if partition not in self._last:
                continue  # no longer owned
            ranges = gaps.get(partition, [])
            tail = tails.get(partition)
            if tail is not None and tail <= self._last[partition] + 1:
                tail = None  # the stream has reached the end by itself meanwhile
            bounds = [*ranges, *([(self._last[partition] + 1, tail)] if tail else [])]
            if not bounds:
                continue
            start = min(a for a, _ in bounds)
            end = max(b for _, b in bounds)
            try:
                offsets = await self._fetch(partition, start, end)
                if epoch != self._epoch:
                    return found
            except TRANSIENT as exc:
                if epoch != self._epoch:
                    return found
                # A gap is forgotten only once its records were read: keep it for next time.
                self._gaps.setdefault(partition, []).extend(ranges)
                if tail is not None:
                    self._tails[partition] = tail
                log.warning(
                    "could not re-read %s[%d] %d..%d yet: %s",
                    self._topic,
                    partition,
                    start,
                    end,
                    exc,
                )
                continue
            skipped = {o for a, b in ranges for o in offsets if a <= o < b}
            if tail is not None:
                # The stream may have moved on while we read: what it reached is handled.
                last = self._last[partition]
                skipped.update(o for o in offsets if last < o < tail)
                if not skipped:
                    # Only markers or aborted records up to the end: nothing was skipped.
                    self._last[partition] = max(last, tail - 1)
            if not skipped:
                continue
            missed = sorted(skipped)
            found += len(missed)
            awaited = self._awaiting.setdefault(partition, {})
            for offset in missed:
                awaited[offset] = (time.monotonic() + REWIND_PATIENCE_S, 1)
            self._want(partition, missed[0])
            log.error(
                "the stream skipped %d committed record(s) in partition %d (first at %d); "
                "rewinding the stream to read them",
                len(missed),
                partition,
                missed[0],
            )
        return found

    async def save_marks(self, partitions: Iterable[int]) -> None:
        """Commit each partition's verified offset to the guard's own group."""
        marks = {
            TopicPartition(self._topic, p): v
            for p in partitions
            if (v := self.verified(p)) is not None and v >= 0
        }
        if not marks:
            return
        marker = await self._started_marker()
        marker.assign(list(marks))
        await marker.commit(marks)

    async def _fetch(self, partition: int, start: int, end: int) -> set[int]:
        """The offsets of committed records in [start, end)."""
        await self._log.start()
        tp = TopicPartition(self._topic, partition)
        return await self._log.offsets_in(tp, start, end, READ_TIMEOUT_S)

    async def _started_marker(self) -> AIOKafkaConsumer:
        if self._marker is None:
            marker = AIOKafkaConsumer(
                bootstrap_servers=self._settings.kafka.bootstrap_servers,
                group_id=self.marks_group,
                enable_auto_commit=False,
                **client_options(self._settings.kafka),
            )
            await marker.start()
            self._marker = marker
        return self._marker

    async def stop(self) -> None:
        """Close the side reader and the mark committer."""
        await self._log.stop()
        if self._marker is not None:
            marker, self._marker = self._marker, None
            await marker.stop()


def _offset(meta: Any) -> int:
    return meta.offset if meta is not None and meta.offset >= 0 else 0
