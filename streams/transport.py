"""The faust transport of the worker: a read_committed consumer, a producer that drains.

faust only reads committed records when ``processing_guarantee="exactly_once"``. We run
at-least-once (see streams/app.py for why) but must never act on records of a publisher
transaction that may still abort: a claim for a delivery whose run never committed would
send a notification for work that does not exist (failure matrix, row 1).

faust commits a consumer offset after ``producer.flush()``, so the table's changelog writes
of the records below it are durable first. faust-streaming 0.15's buffer flush does not
wait for that: it returns once no message was handed to aiokafka for 0.1 s, and it does
not count the message being handed over (waiting for metadata, or for room in a full
batch). A worker stopped right after such a commit leaves the next owner a committed
offset past table states that never reached the changelog: the delivery is never seen
again (PENDING for good) or its claim is forgotten. ``DrainingBuffer`` waits until every
buffered message is in aiokafka's hands, bounded, and fails the commit otherwise. The
table holds its writes back until a commit (streams/table_store.py); the consumer asks
the app to write them (``before_commit``) before that flush.
"""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import FutureMessage

# Longer than any broker hiccup the worker should ride out; a flush that cannot hand its
# messages over in this long fails the offset commit (and the worker) instead of
# committing past table states that were never written.
FLUSH_TIMEOUT_S = 60.0
# With LEDGER_WORKER__FETCH_WAIT_S > 0: a fetch is answered when this much is there.
FETCH_MIN_BYTES = 64 * 1024


class _ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka hands these to its fetcher in start(), which has not run yet.
        consumer._isolation_level = "read_committed"
        wait_ms = getattr(self.app, "fetch_wait_ms", 0)
        if wait_ms > 0:
            # The broker answers a fetch when FETCH_MIN_BYTES are there or wait_ms passed:
            # fewer, fuller fetches under load; at most wait_ms more per record when quiet.
            consumer._fetch_min_bytes = FETCH_MIN_BYTES
            consumer._fetch_max_wait_ms = int(wait_ms)
        return consumer


class _ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        # Every offset commit of the at-least-once path passes here, and faust flushes the
        # producer next: states held back for this commit join the changelog writes first.
        before_commit = getattr(self.app, "before_commit", None)
        if before_commit is not None:
            before_commit()
        return bool(await super()._commit_offsets(offsets, start_new_transaction))


class ChangelogFlushTimeout(RuntimeError):
    """The producer buffer could not hand its messages to aiokafka in time."""


class DrainingBuffer(ProducerBuffer):
    """faust's producer buffer, with a flush that returns only when it is empty."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.handing_over = 0  # taken from the queue, not yet in aiokafka's accumulator

    async def _send_pending(self, fut: FutureMessage) -> None:
        self.handing_over += 1
        try:
            await super()._send_pending(fut)
        finally:
            self.handing_over -= 1

    async def flush(self) -> None:
        """Wait until every buffered message is in aiokafka's hands (bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FLUSH_TIMEOUT_S
        while self.size or self.handing_over:
            if self.state != "running":
                raise RuntimeError("Cannot flush: Producer not Running")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ChangelogFlushTimeout(
                    f"{self.size + self.handing_over} table changelog writes not handed to "
                    f"Kafka after {FLUSH_TIMEOUT_S:.0f} s; offsets are not committed"
                )
            self.message_sent.clear()
            try:
                await asyncio.wait_for(self.message_sent.wait(), timeout=min(0.1, remaining))
            except TimeoutError:
                continue


class _DrainingProducer(faust_aiokafka.Producer):
    def __init__(self, transport: Any, loop: Any = None, **kwargs: Any) -> None:
        super().__init__(transport, loop=loop, **kwargs)
        if self.app.conf.producer_threaded:  # the threaded producer has its own queue
            return
        self.buffer = DrainingBuffer(loop=self.loop, beacon=self.beacon)
        self.buffer.app = self.app


class ReadCommittedTransport(faust_aiokafka.Transport):
    """aiokafka transport with the read_committed consumer and the draining producer."""

    Consumer = _ReadCommittedConsumer
    Producer = _DrainingProducer


class LedgerApp(faust.App):
    """faust.App using ReadCommittedTransport; ``before_commit`` runs right before each
    offset commit hands the changelog writes to Kafka (the write-back table's flush)."""

    fetch_wait_ms: float = 0.0  # LEDGER_WORKER__FETCH_WAIT_S in ms (0: answer at once)

    def before_commit(self) -> object:
        """Replaced by the worker; nothing to write by default."""
        return None

    def on_init_dependencies(self) -> Any:
        """faust's services, less its Monitor among the sensors: it keeps per-event
        statistics for faust's web views, which are off, at about 2% of a worker's CPU.
        It still takes the calls faust makes to it directly (commits, end offsets)."""
        services = super().on_init_dependencies()
        self.sensors.remove(self.monitor)
        return services

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self, loop=self.loop)
