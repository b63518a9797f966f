"""Dead letters the projector writes: for the topics no worker dead-letters, and for any
record its record guard refuses (events/refusal.py).

The live projector (``ledger project``) sends one dead letter per undecodable record —
reason, original bytes and position, ``detected_by="projector"`` — of:

* ``ledger.runs``: no worker reads it;
* ``ledger.endpoints`` and ``ledger.budgets``: every worker (and every dashboard) reads the
  whole of these, each from its start at every restart, and skips a bad record (logged and
  counted: ``ledger_worker_endpoint_records_refused``,
  ``ledger_worker_budget_records_refused``). Were each of them to dead-letter it, one bad
  record would become N copies, N more at each restart. The projector reads every topic
  once per projection, resumes from its own committed offsets, and writes dead letters
  already, so it is the one sender. A record is refused by the same rule the workers
  apply (``decode_endpoint_record``, ``decode_budget_record`` and the signature check).

It sends them before it commits the batch that skips them: a crash in between sends them
again on restart (at least once; a reader dedupes on the original position), and a second
live projection (another database) sends its own. Records on ``ledger.deliveries`` are the
worker's to dead-letter (it reads them first, and every one of them), so one bad record
there is reported once, not by two readers. ``ledger rebuild`` and ``ledger verify``
re-read the log and send nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from clients.kafka_security import client_options
from config.parts import KafkaSettings
from events.deadletter import DeadLetter
from projections.records import LogRecord

DETECTED_BY = "projector"

log = logging.getLogger(__name__)


class ProjectorDeadLetters:
    """Sends the dead letters of one batch's undecodable records of the topics only the
    projector dead-letters (``ledger.runs``, ``ledger.endpoints``, ``ledger.budgets``)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._settings = settings
        self._producer: AIOKafkaProducer | None = None  # made on the first bad record
        self.sent = 0

    async def __aenter__(self) -> Self:
        return self  # connected on the first bad record: most logs have none

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._producer is not None:
            await self._producer.stop()

    async def send(self, records: Sequence[LogRecord]) -> int:
        """Dead-letter every undecodable record of ``records`` on a topic no worker
        dead-letters; wait until the broker has them all. Returns how many were sent."""
        ours = {
            self._settings.topic_runs,
            self._settings.topic_endpoints,
            self._settings.topic_budgets,
        }
        bad = [
            (r, r.reason or "undecodable")
            for r in records
            if r.event is None and r.position.topic in ours
        ]
        return await self._send_or_log(bad)

    async def refused(self, record: LogRecord, reason: str) -> int:
        """Dead-letter one record the projection's record guard refused (either topic: the
        worker folds by other steps, so it may not refuse the same record)."""
        return await self._send_or_log([(record, reason)])

    async def _send_or_log(self, bad: Sequence[tuple[LogRecord, str]]) -> int:
        if not bad:
            return 0
        try:
            return await self._send(bad)
        except KafkaError as exc:
            # Not a reason to stop projecting (a bad record must not stall the projection):
            # the record stays in skipped_records, and the log says what is missing.
            log.error(
                "cannot dead-letter %d bad record(s) of %s (%s): they stay in skipped_records; "
                "hint: the projector's principal needs Write on %s (ledger acls grant "
                "projector USER)",
                len(bad),
                ", ".join(sorted({r.position.topic for r, _ in bad})),
                type(exc).__name__,
                self._settings.topic_deadletter,
            )
            return 0

    async def _send(self, records: Sequence[tuple[LogRecord, str]]) -> int:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._settings.bootstrap_servers,
                enable_idempotence=True,
                acks="all",
                # A dead letter carries the whole original record (up to the codec's 1 MiB).
                max_request_size=4 * 1024 * 1024,
                **client_options(self._settings),
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        producer = self._producer
        futures = []
        for record, reason in records:
            where = record.position
            letter = DeadLetter.of(
                reason=reason,
                topic=where.topic,
                partition=where.partition,
                offset=where.offset,
                key=record.key,
                value=record.value,
                detected_by=DETECTED_BY,
            )
            futures.append(
                await producer.send(
                    self._settings.topic_deadletter,
                    key=record.key,
                    value=letter.model_dump_json().encode(),
                )
            )
        for future in futures:
            await future
        self.sent += len(futures)
        return len(futures)
