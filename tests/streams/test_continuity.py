"""The continuity guard finds committed records the stream skipped, and only those."""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events.delivery_state import Status
from streams.continuity import REWIND_PATIENCE_S, TAIL_PATIENCE_S, ContinuityGuard
from tests.fixtures.broker import ReadTopic
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for


async def commit_offsets(
    settings: Settings, group: str, offsets: dict[TopicPartition, int]
) -> None:
    """Commit ``offsets`` for ``group``, as a worker (or the guard) of that group would."""
    committer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    await committer.start()
    try:
        committer.assign(list(offsets))
        await committer.commit(offsets)
    finally:
        await committer.stop()


async def test_offset_jumps_are_checked_against_committed_records(settings: Settings) -> None:
    topic = settings.kafka.topic_deliveries
    group = f"test-continuity-{uuid.uuid4().hex[:8]}"
    plain = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    txn = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, transactional_id=f"t-{group}"
    )
    await plain.start()
    await txn.start()
    try:
        offsets = [(await plain.send_and_wait(topic, b"r0", partition=0)).offset]
        async with txn.transaction():  # committed: r1, then a commit marker
            await txn.send_and_wait(topic, b"r1", partition=0)
        await txn.begin_transaction()  # aborted: r2, then an abort marker
        await txn.send_and_wait(topic, b"r2", partition=0)
        await txn.abort_transaction()
        offsets.append((await plain.send_and_wait(topic, b"r3", partition=0)).offset)
        offsets.append((await plain.send_and_wait(topic, b"r4", partition=0)).offset)
    finally:
        await plain.stop()
        await txn.stop()
    # The group has committed nothing: the check starts at offset 0.
    guard = ContinuityGuard(settings, topic, group)
    try:
        await guard.on_assigned([0])
        guard.note(0, offsets[0])
        assert guard.pending == 0
        assert await guard.verify() == 0
        # The stream jumps from r0 straight to r4: r1 (committed) and r3 were skipped;
        # r2 (aborted) and the transaction markers are not records.
        guard.note(0, offsets[2])
        assert guard.pending == 1  # noting never blocks on a fetch
        assert await guard.verify() == 2
        r1 = offsets[0] + 1
        # The stream is rewound to the first skipped record at once...
        assert guard.take_rewinds() == {0: r1}
        assert guard.take_rewinds() == {}
        # ...and the gap is not forgotten until both records were handled.
        assert guard.pending == 2
        assert guard.verified(0) == r1
        guard.note(0, r1)
        assert guard.verified(0) == offsets[1]
        # Not seen again in time: asked for again, a bounded number of times.
        later = time.monotonic() + REWIND_PATIENCE_S + 1
        assert guard.take_rewinds(later) == {0: offsets[1]}
        guard.note(0, offsets[1])
        assert guard.pending == 0
        assert guard.recovered == 2
        # Re-delivery of older offsets is not a jump.
        guard.note(0, offsets[2])
        assert guard.pending == 0
        assert guard.last_processed(0) == offsets[2]
        assert guard.verified(0) == offsets[2] + 1
        await guard.save_marks([0])
    finally:
        await guard.stop()

    # The worker group commits past r4, as a worker that skipped and then died would; the
    # guard's own mark is behind it: a new owner checks from the mark, not from the commit.
    tp0 = TopicPartition(topic, 0)
    await commit_offsets(settings, group, {tp0: offsets[2] + 1})
    await commit_offsets(settings, f"{group}.continuity", {tp0: offsets[1]})
    again = ContinuityGuard(settings, topic, group)
    try:
        await again.on_assigned([0])
        assert again.last_processed(0) == offsets[2]
        assert await again.verify() == 2  # r3 and r4, between the mark and the commit
        assert again.take_rewinds() == {0: offsets[1]}
    finally:
        await again.stop()


async def test_a_stream_that_stops_short_of_the_end_is_rewound_to_the_tail(
    settings: Settings,
) -> None:
    """No jump to note: the stream is never handed the records past its start (the demo's
    two requests left PENDING after a SIGKILL). The stalled tail is verified all the same."""
    topic = settings.kafka.topic_deliveries
    group = f"test-tail-{uuid.uuid4().hex[:8]}"
    txn = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, transactional_id=f"t-{group}"
    )
    await txn.start()
    try:
        async with txn.transaction():  # two records, then a commit marker
            first = (await txn.send_and_wait(topic, b"t0", partition=1)).offset
            await txn.send_and_wait(topic, b"t1", partition=1)
        async with txn.transaction():
            t2 = (await txn.send_and_wait(topic, b"t2", partition=2)).offset
    finally:
        await txn.stop()
    # Partition 2 was handled to its end but for its trailing commit marker.
    end2 = t2 + 2  # the record, then the marker
    await commit_offsets(settings, group, {TopicPartition(topic, 2): end2 - 1})
    guard = ContinuityGuard(settings, topic, group)
    try:
        await guard.on_assigned([1, 2])
        # Until the stream has read what was there at assignment, timers wait.
        assert not guard.continuous(1)
        assert not guard.continuous(2)
        # Patience first: a stream that is just slow is not second-guessed.
        assert await guard.check_tails([1, 2]) == 0
        later = time.monotonic() + TAIL_PATIENCE_S + 1
        assert await guard.check_tails([1, 2], now=later) == 2
        assert guard.pending == 2
        assert await guard.verify() == 2  # t0, t1 in partition 1; only a marker in 2
        assert guard.take_rewinds() == {1: first}
        assert guard.verified(1) == first
        # The marker-only tail is settled: it is not checked again and again.
        assert guard.last_processed(2) == end2 - 1
        assert await guard.check_tails([2], now=later + TAIL_PATIENCE_S + 1) == 0
        assert guard.continuous(2)
        guard.note(1, first)
        assert not guard.continuous(1)
        guard.note(1, first + 1)
        assert guard.pending == 0
        # Only its commit marker is left unread: the tail check settles that too.
        assert not guard.continuous(1)
        assert await guard.check_tails([1], now=time.monotonic() + TAIL_PATIENCE_S + 1) == 1
        assert await guard.verify() == 0
        assert guard.continuous(1)
        assert guard.recovered == 2
    finally:
        await guard.stop()


async def test_a_skip_followed_by_a_crash_is_delivered_by_the_next_worker(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    async with Publisher(settings, producer_name="test-agent") as publisher:
        requested = await publisher.run_succeeded(
            "run-skip",
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("s"), payload={})],
        )
    key = requested[0].idempotency_key
    records = await read_topic(settings.kafka.topic_deliveries, raw=True)
    request = next(m for m in records if m.key == key.encode())
    tp = TopicPartition(settings.kafka.topic_deliveries, request.partition)
    end = request.offset + 1
    # A previous owner verified nothing past the request, then committed past it without
    # handing it to its agent (the faust skip), and died.
    await commit_offsets(settings, settings.worker.group, {tp: end})
    await commit_offsets(settings, f"{settings.worker.group}.continuity", {tp: end - 1})
    worker = worker_factory.start("w1")

    async def confirmed() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        state = (await ledger_view()).get(key)
        return state is not None and state.status is Status.CONFIRMED

    await wait_for(confirmed, 60, "the skipped delivery CONFIRMED")
    assert receiver.accepted(key) == 1
    assert len(receiver.requests(key=key, method="POST")) == 1


async def test_a_partition_kept_across_a_pause_is_read_again_from_where_this_worker_was(
    settings: Settings,
) -> None:
    """A worker paused past its session keeps its partitions in its own view; another
    worker processed and committed them meanwhile. faust does not recover a partition it
    sees as kept, so the records in between must go through this worker's stream."""
    topic = settings.kafka.topic_deliveries
    group = f"test-kept-{uuid.uuid4().hex[:8]}"
    plain = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await plain.start()
    try:
        offsets = [(await plain.send_and_wait(topic, b"k", partition=3)).offset for _ in range(4)]
    finally:
        await plain.stop()
    guard = ContinuityGuard(settings, topic, group)
    try:
        await guard.on_assigned([3])
        guard.note(3, offsets[0])  # this worker handled the first record, then froze
        # The other worker handled the rest and committed.
        await commit_offsets(settings, group, {TopicPartition(topic, 3): offsets[3] + 1})
        await guard.on_assigned([3])  # the same partition again, after the rebalance
        assert not guard.continuous(3)
        assert await guard.verify() == 3
        assert guard.take_rewinds() == {3: offsets[1]}
        for offset in offsets[1:]:
            guard.note(3, offset)
        assert guard.continuous(3)
    finally:
        await guard.stop()


async def test_a_rebalance_while_a_jump_is_being_read_drops_that_read(
    settings: Settings,
) -> None:
    """CI: a worker died with KeyError when its partitions were reassigned while ``verify``
    awaited the broker for one of them; it then went on to a partition it had just lost."""
    topic = settings.kafka.topic_deliveries
    group = f"test-epoch-{uuid.uuid4().hex[:8]}"
    plain = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await plain.start()
    try:
        ends = {}
        for partition in (0, 1):
            for n in range(3):
                sent = await plain.send_and_wait(topic, b"x%d" % n, partition=partition)
            ends[partition] = sent.offset
    finally:
        await plain.stop()
    guard = ContinuityGuard(settings, topic, group)
    reading = asyncio.Event()
    reassigned = asyncio.Event()
    real_fetch = guard._fetch

    async def fetch_across_a_rebalance(partition: int, start: int, end: int) -> set[int]:
        found = await real_fetch(partition, start, end)
        reading.set()
        await reassigned.wait()
        return found

    guard._fetch = fetch_across_a_rebalance  # type: ignore[method-assign]
    try:
        await guard.on_assigned([0, 1])
        guard.note(0, 0)  # partition 0 jumps from its first record to its last...
        guard.note(0, ends[0])
        later = time.monotonic() + TAIL_PATIENCE_S + 1  # ...partition 1 never moved
        assert await guard.check_tails([1], now=later) == 1
        assert guard.pending == 2
        check = asyncio.create_task(guard.verify())
        await asyncio.wait_for(reading.wait(), 20)
        await guard.on_assigned([2])  # partitions 0 and 1 went to another worker
        reassigned.set()
        assert await asyncio.wait_for(check, 20) == 0  # what was read is dropped
        assert guard.take_rewinds() == {}
        assert not guard.continuous(0)  # not owned: no timer may act on it
        assert guard.continuous(2)  # empty and owned
    finally:
        await guard.stop()
