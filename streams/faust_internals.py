"""Every faust and mode private attribute and protected override the worker relies on.

faust-streaming has no public way to write a table outside an event, to read one
partition of a table, to run code right before an offset commit hands the producer's
messages to Kafka, to count the message its producer buffer is handing over, to change
the aiokafka consumer it builds, to choose the app's transport class, or to keep the
records it fetched at the end of a rebalance (KeptFlowControl, HookedConsumer's
``seek_to_committed``). Each of those is
done here and nowhere else; tests/streams/test_faust_internals.py holds one test per
faust behaviour this module relies on, so a faust upgrade that changes one fails there
first, by name. tests/test_private_access.py keeps every other module off faust's private
names. aiokafka's private names live in clients/aiokafka_internals.py.

The classes here only add hooks; what the worker does in them is in streams/transport.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator, Mapping
from typing import Any, cast

import faust
from aiokafka import TopicPartition
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.transport.producer import ProducerBuffer
from faust.types import TP, FutureMessage
from mode.services import WaitResults
from mode.utils.objects import cached_property
from mode.utils.queues import FlowControlEvent


def write_table_value(table: Any, partition: int, key: Any, value: bytes) -> None:
    """Put ``value`` (already serialized) under ``key`` in one partition of a rocksdb
    table's store, as faust's own ``table[key] = value`` inside an event would; the
    changelog is not written (``table.send_changelog`` does that)."""
    data = table.data
    raw_key = data._encode_key(key)
    data._db_for_partition(partition).put(raw_key, value)
    data._key_index[raw_key] = partition


def table_partition_values(table: Any, partition: int) -> Iterator[bytes]:
    """Every stored value of one partition of a rocksdb table, streamed; none if the
    partition's database is not open (faust opens it on assignment or first write)."""
    data = table.data
    db = data._dbs.get(partition)
    if db is None:
        return
    offset_key = data.offset_key  # faust's persisted changelog offset shares the database
    for key, value in db.items():
        if key != offset_key:
            yield value


def log_formatter(service: Any) -> Any:
    """The function a mode service formats its log lines with (its label first)."""
    return service._format_log


class HookedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread; its app configures the aiokafka consumer before it starts."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        cast("HookedApp", self.app).configure_consumer(consumer)
        return consumer


def new_worker_consumer(app: Any) -> Any:
    """A new aiokafka consumer as the app's consumer thread builds it for its agents (not
    started); to check what ``configure_consumer`` did."""
    return app.consumer._thread._create_worker_consumer(app.transport)


class HookedConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer, calling the app's ``before_commit`` and ``after_commit``
    around each offset commit.

    At-least-once, every offset commit passes through ``_commit_offsets``, which flushes
    the producer and then commits: what ``before_commit`` hands to the producer is with
    Kafka before the offsets are."""

    def _new_consumer_thread(self) -> Any:
        return HookedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Every stream partition to its committed offset, as faust's ``perform_seek`` asks
        after each rebalance, and a partition with none to its first offset.

        faust relies on this seek to read again the records it took from aiokafka and
        dropped during a rebalance: a ``getmany`` that waited across the revocation is
        handed, once the new assignment is in, a batch of every partition (faust passed
        its set of active partitions, which the revocation emptied, and aiokafka reads an
        empty set as all), finds the flow stopped and drops it, calling ``perform_seek``
        (faust/transport/consumer.py, ``getmany``). aiokafka's ``seek_to_committed`` leaves
        a partition without a committed offset where it is (``if offset and offset > 0``):
        its first records were never read, and later offsets were committed past them
        (``Consumer._new_offset`` checks no gap below the first acked offset while nothing
        is committed). The run fan-out lost whole runs so."""
        committed = await super().seek_to_committed()
        fresh = [
            TopicPartition(tp.topic, tp.partition)
            for tp, offset in committed.items()
            if not offset and not self._is_changelog_tp(tp)
        ]
        if fresh:
            # To the first offsets by number, not ``seek_to_beginning``: that leaves the
            # position unset until a ListOffsets answers, and faust's livelock detector
            # asserts on an unset position (``verify_event_path``): it crashed a worker.
            firsts = await self._thread.earliest_offsets(*fresh)
            await self._thread.seek_wait(firsts)
        return committed

    async def _commit_offsets(
        self, offsets: Mapping[TP, int], start_new_transaction: bool = True
    ) -> bool:
        app = cast("HookedApp", self.app)
        app.before_commit(offsets)
        committed = bool(await super()._commit_offsets(offsets, start_new_transaction))
        app.after_commit(offsets, committed)
        return committed

    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:  # noqa: ASYNC109 - mode's signature
        """mode's ``wait_first``, with a shortcut for a first coroutine that finishes in
        its first step.

        faust's fetcher (``_drain_messages``) hands every record to the streams through
        ``wait_first(callback(message), suspend_flow.wait())``: four tasks (the delivery,
        the flow's stop, the service's stop and crash) and an ``asyncio.wait`` a record,
        33 us in isolation, about 5% of a worker's samples. The delivery nearly always
        finishes at once (the stream's buffer has room), so its first step runs as a task
        of its own first; only a delivery that has to wait is raced against the rest, as
        before (and cancelled if the flow stops first). A delivery that finished wins as it
        would have; the others' coroutines are closed unawaited.
        """
        first, *rest = coros
        if timeout is not None or not asyncio.iscoroutine(first) or self._halted():
            return await super().wait_first(*coros, timeout=timeout)
        task = asyncio.ensure_future(first)
        await asyncio.sleep(0)
        if not task.done():
            return await super().wait_first(task, *rest)
        for other in rest:
            if asyncio.iscoroutine(other):
                other.close()
        result = task.result()  # a delivery's exception propagates, as mode's does
        if self._halted():
            return WaitResults([], [], True)
        return WaitResults([first], [result], False)

    def _halted(self) -> bool:
        return self._stopped.is_set() or self._crashed.is_set()


class HandOverBuffer(ProducerBuffer):
    """faust's producer buffer, counting the messages taken from its queue and not yet in
    aiokafka's accumulator (faust's ``size`` does not count them)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.handing_over = 0

    async def _send_pending(self, fut: FutureMessage) -> None:
        self.handing_over += 1
        try:
            await super()._send_pending(fut)
        finally:
            self.handing_over -= 1


class IdempotentProducer(faust_aiokafka.Producer):
    """faust's producer, idempotent with ``acks=all`` whatever the processing guarantee
    (faust turns idempotence on only inside its transactions): a retried send after a
    leader fails over is not written twice, and a write is taken once the in-sync
    replicas have it."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


class KeptFlowControl(FlowControlEvent):
    """faust's flow control of the agents' queues, which empties them only when the flow
    resumes after a suspension (a revocation), not on every ``resume()``.

    At the end of a rebalance faust resumes the stream partitions, awaits the seek to the
    committed offsets, and then calls ``resume()`` once more (``Recovery.
    on_recovery_completed``), with the flow already running since the changelog recovery:
    mode's ``resume()`` empties every queue again, dropping the records fetched in between
    at the positions of the new assignment. They were never acked, nothing reads them
    again, and the offsets of the records after them were committed past them."""

    def resume(self) -> None:
        if self.is_active():
            return  # flowing: the queues hold this assignment's records
        super().resume()


class HookedTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport with the hooked consumer."""

    Consumer = HookedConsumer


class HookedApp(faust.App):
    """faust.App built on ``transport_class`` (a HookedTransport), with the hooks its
    consumer calls. Subclasses override the hooks; they do nothing here."""

    transport_class: type[HookedTransport] = HookedTransport

    @cached_property
    def flow_control(self) -> FlowControlEvent:
        """The agents' queues' flow control: KeptFlowControl."""
        return KeptFlowControl(loop=self.loop)

    def configure_consumer(self, consumer: Any) -> None:
        """Change the aiokafka consumer faust built for the agents, before it starts."""

    def before_commit(self, offsets: Mapping[TP, int]) -> None:
        """Right before an offset commit flushes the producer and commits ``offsets``."""

    def after_commit(self, offsets: Mapping[TP, int], committed: bool) -> None:
        """After that commit; ``committed`` is False when faust committed nothing (every
        partition was revoked, or the broker refused)."""

    def _new_transport(self) -> Any:
        return self.transport_class(self.conf.broker_consumer, self, loop=self.loop)


def aiokafka_producer_of(app: Any) -> Any:
    """The aiokafka producer the app's transport builds for its sends (not started)."""
    return app.producer._new_producer()


def fetcher_hands_over_through_wait_first() -> bool:
    """Whether faust's fetcher (``Consumer._drain_messages``) delivers each record with
    ``wait_first(callback(message), suspend_flow.wait())``: the call the shortcut in
    ``HookedConsumer.wait_first`` is for."""
    source = inspect.getsource(faust_consumer.Consumer._drain_messages)
    return (
        "await self.wait_first(\n" in source
        and "callback(message), self.suspend_flow.wait()" in source
    )
