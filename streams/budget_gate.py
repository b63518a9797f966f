"""The budget gate: a delivery of an agent over its send budget waits, exactly, across workers.

An agent's deliveries are spread over every partition (keyed by idempotency key), so the
workers that claim them cannot count them alone. They count them in one place instead:
``ledger.budgets`` (events/budgets.py, where the rule is). Every worker reads the whole
topic in the background (``BudgetLog``) and folds it into a ``BudgetBook``; before the
first claim of a delivery whose agent has a budget, the gate (``BudgetGate``):

* grants it when the book says it is within budget (or released, or no budget applies);
* holds it as ``over_budget`` (recorded, shown, counted) when it was spent beyond the
  budget or its window is full — until the window's end, looking again every few
  seconds for an operator's release;
* otherwise appends a ``BudgetSpent`` for it and holds it briefly, unrecorded, until that
  is read back and judged: the log's order, the same for every worker, decides which of
  two racing deliveries is the last within budget.

A record of the topic that is not a budget event, is keyed other than by its agent, or
is not signed as it must be is skipped by every reader (counted in
``ledger_worker_budget_records_refused``) and dead-lettered once, by the live projector,
which reads the topic once per projection (projections/deadletters.py), not by each of
the N workers.

Until the reader has read the topic to its end once (at start), every delivery waits
briefly: a budget might exist. A worker whose budgets topic does not exist treats every
agent as unbudgeted, and says so in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from clients.aiokafka_internals import refresh_metadata
from clients.kafka_security import client_options
from clients.outcome_signing import OutcomeSigner, OutcomeVerifier
from config.settings import Settings
from events.budgets import (
    BudgetBook,
    BudgetDecodeError,
    BudgetSpent,
    Verdict,
    decode_budget_record,
    encode_budget,
    record_key,
    window_text,
)
from events.delivery_state import DeliveryState
from events.refusal import one_line
from events.waiting import WaitReason
from streams.gates import Hold, next_beat

log = logging.getLogger(__name__)

# While the budgets are being read at start: look again this soon.
NOT_READ_S = 1.0
# A spend appended and not read back yet: look again this soon.
SPEND_WAIT_S = 0.3
# A spend not read back after this long (its append failed?) is appended again.
RESPEND_S = 5.0
# An over-budget delivery looks again this often for an operator's release.
RECHECK_S = 2.0
# A missing budgets topic is looked for again this often.
MISSING_TOPIC_S = 5.0


class BudgetLog:
    """Reads ``ledger.budgets`` from its start into ``book`` and appends spends: a
    background reader and writer with ``start()``/``stop()``."""

    def __init__(
        self,
        settings: Settings,
        *,
        verifier: OutcomeVerifier | None,
        signer: OutcomeSigner | None,
    ) -> None:
        self._settings = settings
        self._topic = settings.kafka.topic_budgets
        self._verifier = verifier
        self._signer = signer
        self.book = BudgetBook()
        self.ready = False
        self.refused = 0
        self._spends: asyncio.Queue[BudgetSpent] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def started(self) -> bool:
        """Whether ``start`` was called (and ``stop`` not since)."""
        return bool(self._tasks)

    def start(self) -> None:
        """Begin reading and writing in the background (idempotent; needs a running loop)."""
        if self._tasks:
            return
        self._spends = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._guarded(self._read), name="budgets-reader"),
            asyncio.create_task(self._guarded(self._write), name="budgets-writer"),
        ]

    async def stop(self) -> None:
        """Stop reading and writing; spends not yet appended are dropped (a delivery whose
        spend is lost is spent again by whoever claims it next)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def spend(self, event: BudgetSpent) -> None:
        """Append ``event`` soon (not awaited: the gate must not block)."""
        if self._spends is not None:
            self._spends.put_nowait(event)

    async def _guarded(self, body: Callable[[], Any]) -> None:
        # Broker trouble is waited out; anything else is logged and the loop begins again,
        # never silently dead (the gate keeps holding while the book is not ready).
        while True:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a background loop must not die quietly
                log.error("budgets %s failed, starting again: %s", body.__name__, one_line(exc))
                await asyncio.sleep(1.0)

    async def _read(self) -> None:
        consumer = self._consumer
        if consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self._settings.kafka.bootstrap_servers,
                isolation_level="read_committed",
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **client_options(self._settings.kafka),
            )
            await consumer.start()
            self._consumer = consumer
        parts = await self._partitions(consumer)
        # From the start, into a fresh book: a reader started again (after a failure)
        # must not count a release twice.
        self.ready = False
        self.book = BudgetBook()
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(parts)
        while True:
            if not self.ready and all(await self._at_or_past(consumer, ends)):
                self.ready = True
                log.info("budgets read: %d events, %d budgets", self.book.applied, self._count())
            try:
                batch = await consumer.getmany(timeout_ms=200)
            except KafkaError as exc:
                log.warning("reading budgets: %s", one_line(exc))
                await asyncio.sleep(1.0)
                continue
            for messages in batch.values():
                for message in messages:
                    self._fold(message)

    def _count(self) -> int:
        return len(self.book.budgets)

    async def _at_or_past(
        self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]
    ) -> list[bool]:
        return [await consumer.position(tp) >= end for tp, end in ends.items()]

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        warned = False
        while True:
            await refresh_metadata(consumer, (self._topic,))
            numbers = consumer.partitions_for_topic(self._topic) or set()
            if numbers:
                return [TopicPartition(self._topic, n) for n in sorted(numbers)]
            if not warned:
                log.warning(
                    "budgets topic %s does not exist: no agent has a budget here "
                    "('ledger topics create' makes it)",
                    self._topic,
                )
                warned = True
            self.ready = True  # no topic, no budgets
            await asyncio.sleep(MISSING_TOPIC_S)

    def _fold(self, message: Any) -> None:
        """One record into the book; a bad or forged one is skipped, with the reason, and
        counted (``refused``). Not dead-lettered here: every worker reads the whole topic,
        so each would send its own copy; the live projector, which reads it once per
        projection, sends the one dead letter (projections/deadletters.py)."""
        where = f"{message.topic}[{message.partition}]@{message.offset}"
        try:
            event = decode_budget_record(message.value, message.key)
        except BudgetDecodeError as exc:
            self._refuse(where, str(exc))
            return
        if self._verifier is not None:
            headers = [(str(k), bytes(v or b"")) for k, v in message.headers or ()]
            forged = self._verifier.refuses(event, message.value or b"", headers)
            if forged:
                self._refuse(where, forged)
                return
        self.book.apply(event)

    def _refuse(self, where: str, reason: str) -> None:
        self.refused += 1
        log.warning("budgets: skipping %s: %s", where, reason)

    async def _write(self) -> None:
        assert self._spends is not None
        producer = self._producer
        if producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._settings.kafka.bootstrap_servers,
                enable_idempotence=True,
                acks="all",
                **client_options(self._settings.kafka),
            )
            await producer.start()
            self._producer = producer
        while True:
            events = [await self._spends.get()]
            while not self._spends.empty():
                events.append(self._spends.get_nowait())
            futures = []
            for event in events:
                value = encode_budget(event)
                headers = None if self._signer is None else self._signer.headers(value)
                futures.append(
                    await producer.send(self._topic, value, key=record_key(event), headers=headers)
                )
            for result in await asyncio.gather(*futures, return_exceptions=True):
                if isinstance(result, BaseException):
                    # The gate spends again after RESPEND_S; nothing is granted meanwhile.
                    log.warning("appending a budget spend failed: %s", one_line(result))


class BudgetGate:
    """A ``Gate`` (streams/gates.py): holds the deliveries of an agent over its budget."""

    def __init__(self, budgets: BudgetLog, producer: str) -> None:
        self._budgets = budgets
        self._producer = producer
        # Spends appended and not read back yet: key -> when.
        self._spent: dict[str, datetime] = {}

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """Grant, hold as over budget, or spend and hold until the spend is read back."""
        if state.agent is None:
            return None
        if not self._budgets.ready:
            return Hold(now + timedelta(seconds=NOT_READ_S), "reading the agents' budgets")
        key = state.idempotency_key
        judged = self._budgets.book.judge(state.agent, state.channel, key, now)
        if judged.verdict in (Verdict.UNBUDGETED, Verdict.GRANTED):
            self._spent.pop(key, None)
            return None
        assert judged.window_start is not None
        assert judged.window_end is not None
        if judged.verdict is Verdict.OVER:
            self._spent.pop(key, None)
            window = window_text(int((judged.window_end - judged.window_start).total_seconds()))
            return Hold(
                min(judged.window_end, next_beat(now, timedelta(seconds=RECHECK_S))),
                f"agent {state.agent} has spent its budget: {judged.used} of {judged.limit} "
                f"per {window}, until {judged.window_end.isoformat()}",
                WaitReason.OVER_BUDGET,
            )
        since = self._spent.get(key)
        if since is None or now - since > timedelta(seconds=RESPEND_S):
            self._budgets.spend(
                BudgetSpent(
                    agent=state.agent,
                    channel=state.channel,
                    idempotency_key=key,
                    window_start=judged.window_start,
                    producer=self._producer,
                    occurred_at=now,
                )
            )
            self._spent[key] = now
        return Hold(now + timedelta(seconds=SPEND_WAIT_S), "its budget spend is not read back yet")
