"""Dead letters for ``ledger.runs``: no worker reads that topic, so the projector writes
them.

The live projector (``ledger project``) sends one dead letter per undecodable record on
``ledger.runs`` — reason, original bytes and position, ``detected_by="projector"`` — and
only then commits the batch that skips it: a crash in between sends it again on restart
(at least once; a reader dedupes on the original position). Records on
``ledger.deliveries`` are the worker's to dead-letter (it reads them first, and every one
of them), so one bad record there is reported once, not by two readers. ``ledger
rebuild`` and ``ledger verify`` re-read the log and send nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaProducer

from events.deadletter import DeadLetter
from events.settings import Settings
from projections.records import LogRecord

DETECTED_BY = "projector"


class RunsDeadLetters:
    """Sends the dead letters of one batch's undecodable ``ledger.runs`` records."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            enable_idempotence=True,
            # A dead letter carries the whole original record (up to the codec's 1 MiB).
            max_request_size=4 * 1024 * 1024,
        )
        self.sent = 0

    async def __aenter__(self) -> Self:
        await self._producer.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._producer.stop()

    async def send(self, records: Sequence[LogRecord]) -> int:
        """Dead-letter every undecodable ``ledger.runs`` record of ``records``; wait until
        the broker has them all. Returns how many were sent."""
        futures = []
        for record in records:
            where = record.position
            if record.event is not None or where.topic != self._settings.topic_runs:
                continue
            letter = DeadLetter.of(
                reason=record.reason or "undecodable",
                topic=where.topic,
                partition=where.partition,
                offset=where.offset,
                key=record.key,
                value=record.value,
                detected_by=DETECTED_BY,
            )
            futures.append(
                await self._producer.send(
                    self._settings.topic_deadletter,
                    key=record.key,
                    value=letter.model_dump_json().encode(),
                )
            )
        for future in futures:
            await future
        self.sent += len(futures)
        return len(futures)
