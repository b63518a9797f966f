"""The delivery table holds its writes back until an offset commit (streams/table_store.py).

What must hold: an offset the worker committed never runs ahead of the table states of the
records below it. A worker killed right after a commit leaves its successor a table that
knows every delivery it settled, so a publisher that sends the same run again (a retry
after a timeout) gets no second notification at a receiver that does not dedupe.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events.delivery_state import Status
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory, WorkerProcess, wait_for

RUNS = 12


async def publish_runs(settings: Settings, recipient: str) -> list[str]:
    """The same runs every call: the same idempotency keys, as a retrying agent sends."""
    keys: list[str] = []
    async with Publisher(settings, producer_name="test-agent") as publisher:
        for n in range(RUNS):
            spec = DeliverySpec(channel="webhook", recipient=recipient, payload={"n": n})
            requests = await publisher.run_succeeded(f"run-wb-{n}", "sha256:r", [spec])
            keys.extend(r.idempotency_key for r in requests)
    return keys


async def lag(settings: Settings) -> int:
    """Records of the deliveries topic the worker group has not committed yet."""
    partitions = [
        TopicPartition(settings.kafka.topic_deliveries, p) for p in range(settings.kafka.partitions)
    ]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(
            settings.worker.group, partitions=partitions
        )
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
        await admin.close()
    done = {tp: meta.offset for tp, meta in committed.items() if meta is not None}
    return sum(end - max(done.get(tp, 0), 0) for tp, end in ends.items())


async def committed_to_the_end(settings: Settings, worker: WorkerProcess) -> None:
    async def caught_up() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return await lag(settings) == 0

    await wait_for(caught_up, 60, "the worker group's offsets committed to the topic's end")


async def test_a_worker_killed_after_its_commit_leaves_its_successor_every_settled_state(
    worker_factory: WorkerFactory, receiver_factory: ReceiverFactory, ledger_view: LedgerView
) -> None:
    receiver = receiver_factory(dedupe=False)  # a second send shows as a second arrival
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    hook = receiver.webhook_url("ops")
    keys = await publish_runs(settings, hook)
    first = worker_factory.start("w1")

    async def confirmed() -> bool:
        assert first.alive(), first.output()[-3000:]
        states = await ledger_view()
        return all(k in states and states[k].status is Status.CONFIRMED for k in keys)

    await wait_for(confirmed, 60, f"{RUNS} deliveries CONFIRMED")
    await committed_to_the_end(settings, first)
    first.kill()
    assert [receiver.accepted(k) for k in keys] == [1] * RUNS

    # A successor with an empty data directory: its table is what the changelog holds.
    second = worker_factory.start("w2")
    await publish_runs(settings, hook)
    await committed_to_the_end(settings, second)
    await asyncio.sleep(2.0)  # a send the successor would make has time to arrive
    await committed_to_the_end(settings, second)
    assert [receiver.accepted(k) for k in keys] == [1] * RUNS
