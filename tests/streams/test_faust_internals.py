"""One test per faust-streaming behaviour streams/faust_internals.py relies on.

Each names the behaviour; after a faust upgrade the one that fails says what changed,
before any worker test does. The commit path runs a small faust app on the real broker.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faust.types import TP
from mode.utils.queues import FlowControlEvent, FlowControlQueue

from clients.aiokafka_internals import fetch_options
from config.settings import Settings
from streams.agent_log import quiet
from streams.app import Worker, create_app
from streams.faust_internals import (
    HookedConsumer,
    fetcher_hands_over_through_wait_first,
    log_formatter,
    new_worker_consumer,
    table_partition_values,
    write_table_value,
)
from streams.transport import DrainingBuffer, LedgerApp, ReadCommittedTransport

YIELDS = 1_000


@pytest.fixture
async def worker(tmp_path: Path) -> Worker:
    """A worker built, not started (no broker needed)."""
    return create_app(
        Settings(channels={"webhook_secret": "whsec_" + "A" * 32}, data_dir=tmp_path), "faust"
    )


async def test_a_value_written_outside_an_event_is_the_tables(worker: Worker) -> None:
    """``_encode_key``, ``_db_for_partition`` and ``_key_index``: faust's table reads what
    was put in its partition's database."""
    write_table_value(worker.table, 2, "key-1", b"state-1")
    assert worker.table.get("key-1") == b"state-1"
    assert worker.table.data["key-1"] == b"state-1"


async def test_a_partitions_values_leave_out_the_persisted_offset(worker: Worker) -> None:
    """``_dbs`` holds the partition's database; faust keeps its changelog offset there."""
    write_table_value(worker.table, 1, "key-1", b"state-1")
    worker.table.data.set_persisted_offset(TP(worker.table.changelog_topic.get_topic_name(), 1), 7)
    assert list(table_partition_values(worker.table, 1)) == [b"state-1"]
    assert list(table_partition_values(worker.table, 3)) == []  # never opened


async def test_the_app_is_built_on_the_hooked_transport(worker: Worker) -> None:
    """``_new_transport``: faust builds its transport (and so its consumer and producer)
    from the app's ``transport_class``; the producer sends through our buffer."""
    app = worker.app
    assert isinstance(app.transport, ReadCommittedTransport)
    assert isinstance(app.consumer, HookedConsumer)
    assert isinstance(app.producer.buffer, DrainingBuffer)


async def test_the_agents_consumer_is_configured_before_it_starts(worker: Worker) -> None:
    """``_new_consumer_thread`` and ``_create_worker_consumer``: the aiokafka consumer
    faust builds for the agents passes through the app's ``configure_consumer``."""
    consumer = new_worker_consumer(worker.app)
    assert fetch_options(consumer)[0] == "read_committed"
    await consumer.stop()  # never started; closed, so no warning at collection


async def test_a_resume_while_flowing_keeps_what_the_agents_queues_hold(worker: Worker) -> None:
    """``flow_control``: mode's ``resume()`` empties every agent queue each time it is
    called, and faust calls it once more at the end of a rebalance with the flow running
    (``Recovery.on_recovery_completed``); the app's empties them only after a suspension."""
    plain = FlowControlEvent()
    dropped: FlowControlQueue[int] = FlowControlQueue(flow_control=plain, clear_on_resume=True)
    plain.resume()
    dropped.put_nowait(1)
    plain.resume()
    assert dropped.qsize() == 0  # mode's: the record fetched in between is gone
    flow = worker.app.flow_control
    kept = worker.app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    flow.resume()
    kept.put_nowait(1)
    flow.resume()
    assert kept.qsize() == 1
    flow.suspend()  # a revocation: what the queues hold is the old assignment's
    flow.resume()
    assert kept.qsize() == 0


async def test_the_fetcher_hands_each_record_over_through_wait_first() -> None:
    """``Consumer._drain_messages`` delivers every record with
    ``wait_first(callback(message), suspend_flow.wait())``: the call the consumer's
    ``wait_first`` shortcut is for."""
    assert fetcher_hands_over_through_wait_first()


async def test_a_delivery_that_finishes_at_once_wins_and_one_that_waits_is_raced(
    worker: Worker,
) -> None:
    """The shortcut gives mode's answers: a delivery finished in its first step wins (the
    flow's waiter closed, never awaited); one that waits is cancelled when the flow stops
    first; an exception propagates."""
    consumer = worker.app.consumer
    flow = asyncio.Event()

    async def at_once() -> str:
        return "delivered"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        first = at_once()
        done = await consumer.wait_first(first, flow.wait())
        gc.collect()
    assert (done.done, done.results, done.stopped) == ([first], ["delivered"], False)
    cancelled = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_later(0.01, flow.set)
    raced = await consumer.wait_first(waits(), flow.wait())
    assert raced.results == [True]
    await asyncio.wait_for(cancelled.wait(), 5)

    async def fails() -> None:
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        await consumer.wait_first(fails(), flow.wait())


async def test_an_agents_log_line_starts_with_its_label(worker: Worker) -> None:
    """``_format_log``: mode's formatter of a service's lines, used by the quiet agent log."""
    agent = worker.app.agents["delivery-state-machine"]
    line = log_formatter(agent)(logging.INFO, "hello %s", "there")
    assert agent.shortlabel in line
    assert line.endswith("hello %s")  # formatted, not yet interpolated
    assert quiet(agent).log.logger is agent.logger


async def test_the_buffer_counts_the_message_it_is_handing_over(
    settings: Settings, topic_factory: Callable[[str, int], Awaitable[str]]
) -> None:
    """``ProducerBuffer._send_pending``: a message taken from the queue is handed over
    there (the first send to a topic waits for its metadata in it)."""
    app = create_app(settings, "hand-over").app
    producer = app.producer
    await producer.start()
    try:
        name = await topic_factory("hand-over", 1)  # no metadata yet
        topic = app.topic(name, key_type=bytes, value_type=bytes, value_serializer="raw")
        sent = topic.send_soon(key=b"k", value=b"v")
        seen = 0
        for _ in range(YIELDS):
            seen = max(seen, producer.buffer.handing_over)
            if sent.done():
                break
            await asyncio.sleep(0)
        await producer.flush()
        assert seen == 1
        assert producer.buffer.handing_over == 0
    finally:
        await producer.stop()


class TracingApp(LedgerApp):
    """A LedgerApp whose commit hooks write what they see, and one changelog record of
    its table per commit."""

    steps: list[str]
    table: Any
    sent: list[Any]
    committed_offsets: dict[TP, int]

    def before_commit(self, offsets: Mapping[TP, int]) -> None:
        self.steps.append("before_commit")
        value = uuid.uuid4().hex.encode()
        write_table_value(self.table, 0, "k", value)
        self.sent.append(self.table.send_changelog(0, "k", value))
        buffer = cast(DrainingBuffer, self.producer.buffer)
        if buffer.size or buffer.handing_over:
            self.steps.append("changelog in our buffer")
        self.sent[-1].add_done_callback(lambda _: self.steps.append("changelog acked"))

    def after_commit(self, offsets: Mapping[TP, int], committed: bool) -> None:
        self.steps.append(f"after_commit {committed}")
        if committed:
            self.committed_offsets.update(offsets)


def traced_app(settings: Settings, app_id: str, datadir: Path, partitions: int) -> TracingApp:
    """A TracingApp (consumer group ``app_id``) with its table; no agent yet."""
    app = TracingApp(
        app_id,
        broker=f"kafka://{settings.kafka.bootstrap_servers}",
        store="rocksdb://",
        datadir=str(datadir),
        processing_guarantee="at_least_once",
        topic_partitions=partitions,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.2,
        web_enabled=False,
        autodiscover=False,
        key_serializer="raw",
        value_serializer="raw",
    )
    app.steps, app.sent, app.committed_offsets = [], [], {}
    app.table = app.Table(
        "traced", default=None, partitions=partitions, key_type=str, value_type=bytes
    )
    return app


@pytest.fixture
async def tracing_app(
    settings: Settings, topic_factory: Callable[[str, int], Awaitable[str]], tmp_path: Path
) -> AsyncIterator[TracingApp]:
    """A started TracingApp whose agent has consumed (and acked) one record."""
    source = await topic_factory("traced", 1)
    app = traced_app(settings, f"traced-{uuid.uuid4().hex[:8]}", tmp_path / "traced", 1)
    topic = app.topic(source, key_type=bytes, value_type=bytes, value_serializer="raw")
    seen = asyncio.Event()

    async def consume(stream: Any) -> AsyncIterator[None]:
        async for _ in stream:
            seen.set()
            yield None

    app.agent(topic, name="traced")(consume)
    await app.start()
    try:
        await (await topic.send(key=b"k", value=b"v"))
        await asyncio.wait_for(seen.wait(), 60)
        for _ in range(300):
            if app.committed_offsets:
                break
            await asyncio.sleep(0.1)
        yield app
    finally:
        await app.stop()


async def test_every_offset_commit_passes_through_commit_offsets(
    tracing_app: TracingApp, settings: Settings
) -> None:
    """``Consumer._commit_offsets``: at-least-once, the agent's offsets are committed
    through it, and when it returns True they are at the broker."""
    offsets = tracing_app.committed_offsets
    assert offsets, f"no commit passed through _commit_offsets: {tracing_app.steps}"
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        at_broker = await admin.list_consumer_group_offsets(tracing_app.conf.id)
    finally:
        await admin.close()
    for tp, offset in offsets.items():
        assert at_broker[TopicPartition(tp.topic, tp.partition)].offset >= offset


async def test_changelog_writes_go_through_the_buffer_the_commit_drains(
    tracing_app: TracingApp,
) -> None:
    """``table.send_changelog`` puts the record into the app producer's buffer, and
    ``_commit_offsets`` flushes that producer (the record is acked) before it returns."""
    trace = tracing_app.steps
    first = trace.index("before_commit")
    assert trace[first + 1] == "changelog in our buffer", trace
    acked = trace.index("changelog acked", first)
    assert acked < trace.index("after_commit True", first), trace


async def test_on_revocation_the_signal_follows_the_agents_event_and_the_producer_flush(
    settings: Settings, topic_factory: Callable[[str, int], Awaitable[str]], tmp_path: Path
) -> None:
    """``on_partitions_revoked`` is sent after the agents finished the event they were in
    and the producer was flushed: what the worker's handler then writes is the last write
    of those partitions, and every changelog record the event sent is with Kafka."""
    source = await topic_factory("revoked", 2)
    group = f"revoked-{uuid.uuid4().hex[:8]}"
    first = traced_app(settings, group, tmp_path / "first", 2)
    topic = first.topic(source, key_type=bytes, value_type=bytes, value_serializer="raw")
    started = asyncio.Event()

    async def slow(stream: Any) -> AsyncIterator[None]:
        async for event in stream.events():
            first.steps.append("event started")
            started.set()
            await asyncio.sleep(EVENT_S)  # the second app joins meanwhile
            partition = event.message.partition
            first.sent.append(first.table.send_changelog(partition, "k", b"late"))
            first.steps.append("event done")
            yield None

    async def on_revoked(_app: Any, revoked: set[TP], **_: Any) -> None:
        if not started.is_set():
            return  # the join's own revocation (nothing assigned yet)
        buffer = cast(DrainingBuffer, first.producer.buffer)
        drained = not (buffer.size or buffer.handing_over)
        acked = all(sent.done() for sent in first.sent)
        first.steps.append(f"revoked drained={drained} acked={acked}")

    first.agent(topic, name="slow")(slow)
    connect: Any = first.on_partitions_revoked.connect  # faust types handlers loosely
    connect(on_revoked)
    second = traced_app(settings, group, tmp_path / "second", 2)
    second.agent(second.topic(source, value_serializer="raw"), name="slow")(idle)
    await first.start()
    try:
        await (await topic.send(key=b"k", value=b"v"))
        await asyncio.wait_for(started.wait(), 60)
        await second.start()
        try:
            for _ in range(600):
                if any(step.startswith("revoked") for step in first.steps):
                    break
                await asyncio.sleep(0.1)
        finally:
            await second.stop()
    finally:
        await first.stop()
    revoked = [s for s in first.steps if s.startswith("revoked")]
    assert revoked, first.steps
    assert first.steps.index("event done") < first.steps.index(revoked[0]), first.steps
    assert revoked[0] == "revoked drained=True acked=True", first.steps


EVENT_S = 4.0


async def idle(stream: Any) -> AsyncIterator[None]:
    """An agent that takes its records and does nothing."""
    async for _ in stream:
        yield None
