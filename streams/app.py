"""The faust-streaming app of ``ledger worker``, built by ``create_app(settings)``.

One agent consumes ``ledger.deliveries`` (read_committed, at-least-once) and folds each
record into a rocksdict-backed table with a changelog. Claims and dead letters are
appended from the agent; the sender and the timers run beside it and append outcomes
with a separate idempotent producer. Every append may be seen more than once, so the
fold dedupes by event_id and fences by token.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mode import CrashingSupervisor

from events.base import Event
from events.codec import encode
from events.deadletter import DeadLetter
from events.delivery_state import DeliveryState
from events.settings import Settings
from events.topics import record_key
from streams.channels.registry import ChannelRegistry
from streams.continuity import ContinuityGuard
from streams.decisions import Context
from streams.metrics import WorkerMetrics
from streams.outbox import Outbox
from streams.processor import DeliveryProcessor, Record
from streams.retry import rules_for
from streams.sender import Sender
from streams.state_codec import dumps, loads
from streams.timers import DueIndex
from streams.transport import LedgerApp
from streams.watchdog import ConsumerLag, Watchdog

log = logging.getLogger(__name__)

CONTINUITY_VERIFY_EVERY_S = 1.0

# Per partition database of the delivery table: small memtables and a small block cache.
# The working set is the open deliveries' recent states; RocksDB reads the rest from disk.
TABLE_ROCKSDB_OPTIONS = {
    "write_buffer_size": 4 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "target_file_size_base": 16 * 1024 * 1024,
    "block_cache_size": 8 * 1024 * 1024,
    "block_cache_compressed_size": 0,
}


def utc_now() -> datetime:
    """Processing time, passed into the pure decisions as ``now``."""
    return datetime.now(UTC)


def new_worker_id(name: str) -> str:
    """Unique per process: a claim is acted on only by the process that made it."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class TableStore:
    """The faust table as the processor's StateStore (values are state_codec bytes)."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``."""
        raw = self._table.get(key)
        return None if raw is None else loads(raw)

    def put(self, key: str, state: DeliveryState) -> None:
        """Replace the state of ``key`` (inside the agent: goes to the changelog)."""
        self._table[key] = dumps(state)

    def partition_states(self, partition: int) -> Iterator[DeliveryState]:
        """Every state stored for one partition, streamed (used to rebuild timers)."""
        db = self._table.data._dbs.get(partition)  # faust has no public per-partition API
        if db is None:
            return
        offset_key = self._table.data.offset_key
        for key, value in db.items():
            if key != offset_key:
                yield loads(value)


@dataclass
class Worker:
    """The app and the pieces tests and metrics look at."""

    app: Any
    worker_id: str
    processor: DeliveryProcessor
    sender: Sender
    outbox: Outbox
    owned: set[int] = field(default_factory=set)
    metrics: WorkerMetrics | None = None


def create_app(settings: Settings, name: str = "worker") -> Worker:
    """Build the worker's faust app; nothing global, nothing started."""
    worker_id = new_worker_id(name)
    datadir = settings.data_dir / "worker" / settings.worker_group / name
    datadir.mkdir(parents=True, exist_ok=True)
    # faust's decorators and signals are loosely typed; the app is handled as Any here.
    app: Any = LedgerApp(
        settings.worker_group,
        broker=f"kafka://{settings.bootstrap_servers}",
        # at-least-once, deliberately: faust's exactly_once crash-loops on every rebalance of
        # a multi-worker group against Kafka 4.1 (ConsistencyError on an unfetched LSO, then
        # ProducerFenced from reused producers), and after a SIGKILL it still replayed
        # duplicates and skipped offsets. Correctness comes from the fold instead: dedupe
        # by event_id, fencing tokens, one send per (key, token) per process, leases.
        processing_guarantee="at_least_once",
        store="rocksdb://",
        datadir=str(datadir),
        topic_partitions=settings.partitions,
        topic_allow_declare=True,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.5,
        web_enabled=False,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        # A dying agent must take the worker down, not leave it alive consuming nothing.
        agent_supervisor=CrashingSupervisor,
        autodiscover=False,
        # Keys and values are bytes we encode ourselves (events/codec.py, state_codec.py).
        key_serializer="raw",
        value_serializer="raw",
        stream_wait_empty=False,
        # Claims, dead letters and changelog writes are small: let them share requests.
        producer_linger=0.005,
    )
    deliveries: Any = app.topic(
        settings.topic_deliveries,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
    )
    deadletters = app.topic(
        settings.topic_deadletter,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
    )
    table: Any = app.Table(
        "delivery-state",
        default=None,
        partitions=settings.partitions,
        key_type=str,
        value_type=bytes,
        # faust's RocksDB defaults (64 MB x 3 memtables and a 2 GB block cache per
        # partition) let a worker with a million open deliveries grow past a gigabyte.
        options=TABLE_ROCKSDB_OPTIONS,
    )
    store = TableStore(table)
    outbox = Outbox(settings)
    ctx = Context(
        worker_id=worker_id,
        producer=f"ledger-worker/{name}",
        rules=rules_for(settings),
        receiver_dedupes=lambda channel: channels[channel].receiver_dedupes,
        lease_s=settings.lease_seconds,
        claim_grace_s=settings.claim_grace_seconds,
    )
    registry = ChannelRegistry(settings)
    channels = registry.channels
    metrics = WorkerMetrics()
    sender = Sender(
        channels,
        ctx,
        outbox.append,
        utc_now,
        settings.send_concurrency,
        settings.faults,
        metrics,
    )

    async def append_in_txn(events: Sequence[Event]) -> None:
        for event in events:
            await deliveries.send(key=record_key(event), value=encode(event))  # type: ignore[arg-type]

    async def dead_letter(record: Record, reason: str) -> None:
        letter = DeadLetter.of(
            reason=reason,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            detected_by=worker_id,
        )
        await deadletters.send(key=record.key, value=letter.model_dump_json().encode())

    due = DueIndex(datadir / "due-index")
    processor = DeliveryProcessor(
        ctx,
        store,
        append_in_txn,
        outbox.append,
        dead_letter,
        sender,
        due,
        utc_now,
        settings.faults,
        metrics,
    )
    worker = Worker(app, worker_id, processor, sender, outbox)
    continuity = ContinuityGuard(
        settings.bootstrap_servers, settings.topic_deliveries, settings.worker_group
    )
    lag = ConsumerLag(app, settings.topic_deliveries, continuity)
    watchdog = Watchdog(lag)
    metrics.watch(
        "ledger_worker_due_timers", "Timers scheduled (leases, retries, lookups).", lambda: due.size
    )
    metrics.watch(
        "ledger_worker_inflight_sends", "Sends and lookups in flight.", lambda: sender.in_flight
    )
    metrics.watch(
        "ledger_worker_consumer_lag", "Records waiting in owned partitions.", lambda: lag.value
    )
    metrics.watch(
        "ledger_worker_owned_partitions", "Partitions this worker owns.", lambda: len(worker.owned)
    )
    metrics.watch(
        "ledger_worker_sender_failures",
        "Sender tasks that raised (counted).",
        lambda: sender.failures,
    )
    worker.metrics = metrics

    @app.agent(deliveries, name="delivery-state-machine")
    async def state_machine(stream: Any) -> AsyncIterator[None]:
        async for event in stream.events():
            message = event.message
            record = Record(
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                key=message.key,
                value=message.value,
            )
            try:
                continuity.note(record.partition, record.offset)
                for missed in continuity.take_recovered(record.partition):
                    metrics.skipped_recovered.inc()
                    await processor.handle(missed)
                await processor.handle(record)
            except BaseException:
                # Crash loudly and WITHOUT committing this record: faust's supervisors
                # would commit it first (it would be lost) or restart the agent quietly.
                log.critical("delivery agent failed on %s; exiting", record, exc_info=True)
                logging.shutdown()
                os._exit(70)
            watchdog.progressed()
            yield None

    @app.on_partitions_assigned.connect
    async def assigned(_app: Any, assigned: set[Any], **_: Any) -> None:
        mine = {tp.partition for tp in assigned if tp.topic == settings.topic_deliveries}
        for partition in worker.owned - mine:
            processor.forget(partition)
        worker.owned.clear()
        worker.owned.update(mine)
        await continuity.on_assigned(mine)
        log.info("worker %s owns partitions %s", worker_id, sorted(mine))

    @app.on_partitions_revoked.connect
    async def revoked(_app: Any, revoked: set[Any], **_: Any) -> None:
        gone = {tp.partition for tp in revoked if tp.topic == settings.topic_deliveries}
        for partition in gone:
            processor.forget(partition)
        worker.owned.difference_update(gone)

    @table.on_recover
    async def recovered() -> None:
        # Timers are derived state: rebuild them from the recovered table.
        total = sum(processor.reindex(p, store.partition_states(p)) for p in worker.owned)
        log.info("rebuilt %d timers for partitions %s", total, sorted(worker.owned))
        watchdog.ready()

    next_verify = [0.0]

    @app.timer(interval=settings.timer_interval_seconds)
    async def timers() -> None:
        if worker.owned and not app.in_recovery:
            began = time.perf_counter()
            await processor.tick(set(worker.owned))
            metrics.timer_tick_seconds.observe(time.perf_counter() - began)
        lag.refresh()
        watchdog.check(app.in_recovery)
        if continuity.pending and time.monotonic() >= next_verify[0]:
            next_verify[0] = time.monotonic() + CONTINUITY_VERIFY_EVERY_S
            await continuity.verify()

    @app.on_before_shutdown.connect
    async def shutting_down(_app: Any, **_: Any) -> None:
        # In-flight sends finish (bounded) so their outcomes are recorded; what does not
        # finish is left to its lease, which the next owner resolves by lookup.
        await sender.drain(timeout_s=settings.http_timeout_s + 1)
        await outbox.stop()
        await registry.aclose()
        await continuity.stop()

    return worker
