"""Group commit: the runs of concurrent callers share one Kafka transaction.

A Kafka transaction costs the same round trips and one commit marker per partition it
touched whether it carries one run or a hundred, so a publisher that gives each run its
own transaction is capped by that cost however many callers it has. Here each caller's
records join a queue; one transaction commits what is queued (bounded by runs, bytes and
a short linger), and each caller returns when the transaction holding its run has
committed. A run is never split across transactions, so its events stay all-or-nothing;
a transaction that fails fails exactly the callers in it.

A caller cancelled before its run was taken into a transaction leaves nothing behind; one
cancelled later may find its run committed all the same, as with any commit in flight.

A ``Journal`` (optional) keeps a record beside each run that comes with a ticket, one write
per transaction instead of one per run: ``prepare`` before anything of the batch is sent
(it may leave runs out, each with the error its caller gets), ``committed`` after the
commit and before any caller returns. The HTTP API keeps its first answers so
(api/idempotency.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced

from clients.aiokafka_internals import transaction_failed_fatally
from clients.kafka_security import NOT_AUTHORIZED, not_allowed
from config.settings import Settings
from events.errors import LedgerError
from events.faults import PUBLISHER_BEFORE_COMMIT, crash_if_enabled

log = logging.getLogger(__name__)

Record = tuple[str, bytes, bytes, list[tuple[str, bytes]] | None]
"""One Kafka record: topic, value, key, headers (the ``traceparent`` of a delivery request)."""


class PublishFailed(LedgerError):
    """The Kafka transaction carrying a run did not commit.

    ``written`` is False when none of the run's events were written (the transaction
    never reached its commit: read_committed consumers will never see them), None when
    it failed while committing and nobody can tell.
    """

    def __init__(self, message: str, hint: str, *, written: bool | None) -> None:
        super().__init__(message, hint)
        self.written = written


class Journal(Protocol):
    """Records kept beside the runs of each transaction, in one write per transaction."""

    def prepare(self, tickets: list[Any]) -> dict[int, BaseException]:
        """Before anything of the batch is sent: record ``tickets``; the runs to leave out
        (index in ``tickets``: the exception their caller gets; nothing of them is sent)."""
        ...

    def committed(self, tickets: list[Any]) -> None:
        """After the transaction committed, before any of its callers returns (an error
        here is logged: the runs are committed all the same)."""
        ...


@dataclass(eq=False)
class _Pending:
    """One caller's run, waiting for the transaction that will carry it."""

    run_id: str
    records: list[Record]
    size: int
    arrived: float
    future: asyncio.Future[None] = field(repr=False)
    ticket: Any = None


class GroupCommit:
    """Coalesces concurrent runs into few transactions of one transactional producer."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        settings: Settings,
        transactional_id: str,
        journal: Journal | None = None,
    ):
        """``producer`` is started and transactional; this object is its only user."""
        self._producer = producer
        self._journal = journal
        self._settings = settings
        self._transactional_id = transactional_id
        self._max_runs = settings.publisher.max_runs_per_transaction
        self._max_bytes = settings.publisher.max_transaction_bytes
        self._linger_s = settings.publisher.linger_s
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        # Set once the producer can commit nothing more (fenced, or the loop ended).
        self._dead: tuple[str, str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_end = 0.0  # loop time the previous transaction ended
        self.transactions = 0
        self.runs = 0

    def start(self) -> None:
        """Start the committer task."""
        self._task = asyncio.create_task(
            self._commit_loop(), name=f"group-commit {self._transactional_id}"
        )

    async def submit(self, run_id: str, records: list[Record], ticket: Any = None) -> None:
        """Return once a transaction holding all of ``records`` committed, or raise
        ``PublishFailed`` (or what the journal's ``prepare`` gave for ``ticket``)."""
        if self._dead is not None:
            cause, hint = self._dead
            raise PublishFailed(
                f"run {run_id} was not published: this publisher can publish nothing more "
                f"({cause}); none of the run's events were written",
                hint,
                written=False,
            )
        if self._closing or self._task is None:
            raise PublishFailed(
                f"run {run_id} was not published: the publisher is "
                f"{'stopping' if self._closing else 'not started'}; "
                "none of the run's events were written",
                "publish while the publisher is open ('async with Publisher(...)')",
                written=False,
            )
        loop = asyncio.get_running_loop()
        size = sum(len(value) + len(key) for _, value, key, _headers in records)
        pending = _Pending(run_id, records, size, loop.time(), loop.create_future(), ticket)
        was_empty = not self._queue
        self._queue.append(pending)
        self._queued_bytes += size
        # The committer sleeps on an empty queue, or lingers until the batch is full.
        if was_empty or self._full():
            self._wakeup.set()
        await pending.future

    async def close(self) -> None:
        """Commit what is queued and end; past the transaction timeout, give up and fail
        every caller still waiting (nobody is left hanging)."""
        self._closing = True
        self._wakeup.set()
        task, self._task = self._task, None
        if task is None:
            return
        grace = self._settings.publisher.transaction_timeout_s
        done, _ = await asyncio.wait({task}, timeout=grace)
        if not done:
            log.warning("group commit: still committing after %.0f s at stop; giving up", grace)
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("group commit: the committer ended on %r", exc)

    def _full(self) -> bool:
        return len(self._queue) >= self._max_runs or self._queued_bytes >= self._max_bytes

    async def _commit_loop(self) -> None:
        try:
            while (batch := await self._next_batch()) is not None:
                if batch:
                    await self._commit(batch)
        except Exception as exc:
            self._dead = (f"its committer failed: {exc!r}", "start a new publisher")
            raise
        finally:
            # Whatever ended the loop (stop, cancellation, a bug), no caller is left waiting.
            if self._dead is None:
                self._dead = ("it was stopped", "start a new publisher")
            self._fail_queued()

    async def _next_batch(self) -> list[_Pending] | None:
        """The runs of the next transaction ([] if every one was cancelled), or None once
        stopping with nothing left."""
        while not self._queue:
            if self._closing:
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        loop = asyncio.get_running_loop()
        # The linger counts from the oldest run's arrival, or from the end of the previous
        # transaction if that is later: right after a commit the coordinator is still
        # writing its markers and answers a new transaction's first partitions with
        # CONCURRENT_TRANSACTIONS, which aiokafka retries only after 20 ms (KAFKA-5477).
        deadline = max(self._queue[0].arrived, self._last_end) + self._linger_s
        while not self._closing and not self._full() and (left := deadline - loop.time()) > 0:
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)
        batch: list[_Pending] = []
        size = 0
        while self._queue and len(batch) < self._max_runs:
            head = self._queue[0]
            if batch and size + head.size > self._max_bytes:
                break  # a run larger than the bound still gets a transaction of its own
            self._queue.popleft()
            self._queued_bytes -= head.size
            if head.future.done():
                continue  # its caller was cancelled before anything was sent
            batch.append(head)
            size += head.size
        return batch

    def _prepare(self, batch: list[_Pending]) -> list[_Pending]:
        """The batch less the runs the journal left out (their callers get its error)."""
        journal = self._journal
        ticketed = [pending for pending in batch if pending.ticket is not None]
        if journal is None or not ticketed:
            return batch
        try:
            refused = journal.prepare([pending.ticket for pending in ticketed])
        except Exception as exc:  # noqa: BLE001 - a journal that failed: none of its runs go
            refused = dict.fromkeys(range(len(ticketed)), exc)
        for index, why in refused.items():
            pending = ticketed[index]
            if not pending.future.done():
                pending.future.set_exception(why)
        left = {id(ticketed[index]) for index in refused}
        return [pending for pending in batch if id(pending) not in left]

    def _committed(self, batch: list[_Pending]) -> None:
        tickets = [pending.ticket for pending in batch if pending.ticket is not None]
        if self._journal is None or not tickets:
            return
        try:
            self._journal.committed(tickets)
        except Exception as exc:  # noqa: BLE001 - committed all the same: the callers return
            log.warning("group commit: the journal did not record a commit: %r", exc)

    async def _commit(self, batch: list[_Pending]) -> None:
        batch = self._prepare(batch)
        if not batch:
            return
        producer = self._producer
        committing = False
        try:
            async with producer.transaction():
                # send() only queues a record: the producer pipelines them all, per partition.
                sent = [
                    await producer.send(topic, value, key=key, headers=headers)
                    for pending in batch
                    for topic, value, key, headers in pending.records
                ]
                for outcome in await asyncio.gather(*sent, return_exceptions=True):
                    if isinstance(outcome, BaseException):
                        raise outcome
                crash_if_enabled(PUBLISHER_BEFORE_COMMIT, self._settings.faults)
                committing = True  # leaving the block commits
        except BaseException as exc:
            self._last_end = asyncio.get_running_loop().time()
            # Before the commit was asked for, the transaction can never commit: aborted
            # here, or by the broker (timeout, fencing). During the commit, nobody knows.
            self._fail(batch, exc, written=None if committing else False)
            if not isinstance(exc, Exception):
                raise  # cancelled: stop gave up waiting
            return
        self._last_end = asyncio.get_running_loop().time()
        self.transactions += 1
        self.runs += len(batch)
        self._committed(batch)
        for pending in batch:
            if not pending.future.done():
                pending.future.set_result(None)

    def _fail(self, batch: list[_Pending], exc: BaseException, *, written: bool | None) -> None:
        cause = self._cause(exc)
        fatal = transaction_failed_fatally(self._producer)
        if fatal:
            self._dead = (cause, _hint(exc, fatal=True))
        hint = _hint(exc, fatal=fatal, written=written)
        others = len(batch) - 1
        company = f" (and {others} other run{'s' if others != 1 else ''})" if others else ""
        for pending in batch:
            if pending.future.done():
                continue
            if written is False:
                message = (
                    f"run {pending.run_id} was not published: the Kafka transaction carrying "
                    f"it{company} failed ({cause}); none of the run's events were written"
                )
            else:
                message = (
                    f"run {pending.run_id} may not be published: the Kafka transaction "
                    f"carrying it{company} failed while committing ({cause}); whether its "
                    "events were written is not known"
                )
            error = PublishFailed(message, hint, written=written)
            error.__cause__ = exc
            pending.future.set_exception(error)
        if fatal:
            self._fail_queued()

    def _fail_queued(self) -> None:
        cause, hint = self._dead or ("it was stopped", "start a new publisher")
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(
                    PublishFailed(
                        f"run {pending.run_id} was not published: this publisher can publish "
                        f"nothing more ({cause}); none of the run's events were written",
                        hint,
                        written=False,
                    )
                )
        self._queued_bytes = 0

    def _cause(self, exc: BaseException) -> str:
        if isinstance(exc, ProducerFenced):
            return (
                "fenced: another publisher started with the same transactional_id "
                f"{self._transactional_id!r}"
            )
        if isinstance(exc, NOT_AUTHORIZED):
            return not_allowed(self._settings.kafka, exc).message
        if isinstance(exc, asyncio.CancelledError):
            return "the publisher stopped while it was in flight"
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _hint(exc: BaseException, *, fatal: bool, written: bool | None = False) -> str:
    if isinstance(exc, ProducerFenced):
        return (
            "a transactional_id belongs to one live publisher: this one can publish nothing "
            "more; publish from the newer one"
        )
    if fatal:
        return "this publisher can publish nothing more: start a new one"
    if isinstance(exc, NOT_AUTHORIZED):
        return "an administrator grants it with ACLs (README, Security: the ACLs per role)"
    if written is None:
        return "check whether the run is in the ledger before publishing it again"
    return "nothing of the run was written: publishing it again is safe"
