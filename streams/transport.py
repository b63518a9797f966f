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
the app's ``write_back`` to write them before that flush (``before_commit``) and tells it
when the offsets are committed (``after_commit``). faust's internals behind all of this
are in streams/faust_internals.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from faust.types import TP

from clients.aiokafka_internals import set_fetch_options
from streams.faust_internals import (
    HandOverBuffer,
    HookedApp,
    HookedTransport,
    IdempotentProducer,
)

# Longer than any broker hiccup the worker should ride out; a flush that cannot hand its
# messages over in this long fails the offset commit (and the worker) instead of
# committing past table states that were never written.
FLUSH_TIMEOUT_S = 60.0
# With LEDGER_WORKER__FETCH_WAIT_S > 0: a fetch is answered when this much is there.
FETCH_MIN_BYTES = 64 * 1024


class ChangelogFlushTimeout(RuntimeError):
    """The producer buffer could not hand its messages to aiokafka in time."""


class DrainingBuffer(HandOverBuffer):
    """faust's producer buffer, with a flush that returns only when it is empty."""

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


class _DrainingProducer(IdempotentProducer):
    def __init__(self, transport: Any, loop: Any = None, **kwargs: Any) -> None:
        super().__init__(transport, loop=loop, **kwargs)
        if self.app.conf.producer_threaded:  # the threaded producer has its own queue
            return
        self.buffer = DrainingBuffer(loop=self.loop, beacon=self.beacon)
        self.buffer.app = self.app


class ReadCommittedTransport(HookedTransport):
    """aiokafka transport with the hooked (read_committed) consumer and the draining
    producer."""

    Producer = _DrainingProducer


class WriteBack(Protocol):
    """What is told about each offset commit (streams/table_store.py)."""

    def before_commit(self) -> int:
        """Write what is held back, right before the producer is flushed and the offsets
        committed; how many states were written."""
        ...

    def after_commit(self, committed: bool) -> None:
        """The commit ended; ``committed`` is False if it committed nothing."""
        ...


class LedgerApp(HookedApp):
    """faust.App using ReadCommittedTransport: its agents' consumer reads committed records
    only, and its ``write_back`` (the delivery table) is flushed right before each offset
    commit hands the changelog writes to Kafka."""

    transport_class = ReadCommittedTransport
    fetch_wait_ms: float = 0.0  # LEDGER_WORKER__FETCH_WAIT_S in ms (0: answer at once)
    write_back: WriteBack | None = None  # set by the worker

    def configure_consumer(self, consumer: Any) -> None:
        """read_committed, and the fetch wait when one is set."""
        if self.fetch_wait_ms > 0:
            # The broker answers a fetch when FETCH_MIN_BYTES are there or wait_ms passed:
            # fewer, fuller fetches under load; at most wait_ms more per record when quiet.
            set_fetch_options(
                consumer,
                isolation_level="read_committed",
                fetch_min_bytes=FETCH_MIN_BYTES,
                fetch_max_wait_ms=int(self.fetch_wait_ms),
            )
        else:
            set_fetch_options(consumer, isolation_level="read_committed")

    def before_commit(self, offsets: Mapping[TP, int]) -> None:
        """States held back for this commit join the changelog writes faust flushes next."""
        if self.write_back is not None:
            self.write_back.before_commit()

    def after_commit(self, offsets: Mapping[TP, int], committed: bool) -> None:
        """The held-back states the commit covers are committed (or wait for the next)."""
        if self.write_back is not None:
            self.write_back.after_commit(committed)

    def on_init_dependencies(self) -> Any:
        """faust's services, less its Monitor among the sensors: it keeps per-event
        statistics for faust's web views, which are off, at about 2% of a worker's CPU.
        It still takes the calls faust makes to it directly (commits, end offsets)."""
        services = super().on_init_dependencies()
        self.sensors.remove(self.monitor)
        return services
