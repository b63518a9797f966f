"""The continuity guard finds committed records the stream skipped, and only those."""

from __future__ import annotations

import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from events.settings import Settings
from streams.continuity import ContinuityGuard


async def test_offset_jumps_are_checked_against_committed_records(settings: Settings) -> None:
    topic = settings.topic_deliveries
    group = f"test-continuity-{uuid.uuid4().hex[:8]}"
    plain = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    txn = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, transactional_id=f"t-{group}"
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
    guard = ContinuityGuard(settings.bootstrap_servers, topic, group)
    try:
        await guard.on_assigned([0])
        guard.note(0, offsets[0])
        assert guard.pending == 0
        assert await guard.verify() == 0
        # The stream jumps from r0 straight to r4: r1 (committed) and r3 were skipped;
        # r2 (aborted) and the transaction markers are not records.
        guard.note(0, offsets[2])
        assert guard.pending == 1
        assert guard.take_recovered(0) == []  # noting never blocks on a fetch
        assert await guard.verify() == 2
        assert [m.value for m in guard.take_recovered(0)] == [b"r1", b"r3"]
        assert guard.take_recovered(0) == []
        assert guard.recovered == 2
        # Re-delivery of older offsets is not a jump.
        guard.note(0, offsets[1])
        assert guard.pending == 0
        assert guard.last_processed(0) == offsets[2]
    finally:
        await guard.stop()

    # Once the group has committed an offset, the check starts there.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.commit({TopicPartition(topic, 0): offsets[1]})
    finally:
        await consumer.stop()
    again = ContinuityGuard(settings.bootstrap_servers, topic, group)
    try:
        await again.on_assigned([0])
        again.note(0, offsets[1])
        again.note(0, offsets[2] + 1)
        assert await again.verify() == 1
        assert [m.value for m in again.take_recovered(0)] == [b"r4"]
    finally:
        await again.stop()
