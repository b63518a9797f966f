"""The worker keeps going on bad input, and dies loudly (not silently) when it cannot."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from events import DeadLetter, DeliverySpec, Publisher
from events.codec import encode
from events.delivery import new_delivery_requested
from events.delivery_state import Status
from events.keys import canonical_json
from events.settings import Settings
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.worker import LedgerView, WorkerFactory, WorkerProcess, wait_for


async def after_the_bad_records(
    settings: Settings,
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: object,
    run_id: str,
) -> tuple[str, WorkerProcess, dict[tuple[int, int], DeadLetter]]:
    """Publish one good delivery behind the bad records, start a worker, and wait until it
    is CONFIRMED and two dead letters are out: the key, the worker and the dead letters by
    their original (partition, offset)."""
    async with Publisher(settings) as publisher:
        requests = await publisher.run_succeeded(
            run_id,
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url(run_id), payload={})],
        )
    key = requests[0].idempotency_key
    worker = worker_factory.start("w1")

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        states = await ledger_view()
        letters = await read_topic(settings.topic_deadletter, raw=True)  # type: ignore[operator]
        return key in states and states[key].status is Status.CONFIRMED and len(letters) >= 2

    await wait_for(done, 90, "the good delivery CONFIRMED and two dead letters")
    letters = [
        DeadLetter.model_validate_json(m.value)
        for m in await read_topic(settings.topic_deadletter, raw=True)  # type: ignore[operator]
    ]
    return key, worker, {(d.original_partition, d.original_offset): d for d in letters}


async def test_bad_records_are_dead_lettered_and_processing_continues(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: object,
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        garbage = await producer.send_and_wait(
            settings.topic_deliveries, b"\x00not json", key=b"k1", partition=0
        )
        invalid = await producer.send_and_wait(
            settings.topic_deliveries,
            b'{"type": "delivery.requested", "schema_version": 2}',
            key=b"k2",
            partition=0,
        )
    finally:
        await producer.stop()
    key, _worker, by_offset = await after_the_bad_records(
        settings, worker_factory, receiver, ledger_view, read_topic, "run-after-bad"
    )
    first = by_offset[(0, garbage.offset)]
    assert first.original_topic == settings.topic_deliveries
    assert "not JSON" in first.reason
    assert first.original_value() == b"\x00not json"
    second = by_offset[(0, invalid.offset)]
    assert "invalid event" in second.reason
    assert "idempotency_key" in second.reason
    assert receiver.accepted(key) == 1


async def test_a_deep_or_oversized_record_is_dead_lettered_not_a_crash(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: object,
) -> None:
    """Written by a raw producer, as anyone with write access to the topic can: a 10 KB
    record nested 5,000 deep (the worker used to exit 70 on it at every restart) and a
    well-formed request with a 700 KB payload (the SDK refuses it; the worker sent it)."""
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    huge = new_delivery_requested(
        run_id="run-huge",
        event_type="run.succeeded",
        channel="webhook",
        recipient=receiver.webhook_url("huge"),
        payload={"blob": "x" * 700_000},
        slo_seconds=60,
        producer="raw",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, max_request_size=2 * 1024 * 1024
    )
    await producer.start()
    try:
        deep = await producer.send_and_wait(
            settings.topic_deliveries, b"[" * 5000 + b"]" * 5000, key=b"d1", partition=0
        )
        big = await producer.send_and_wait(
            settings.topic_deliveries,
            encode(huge),
            key=huge.idempotency_key.encode(),
            partition=0,
        )
    finally:
        await producer.stop()
    key, worker, letters = await after_the_bad_records(
        settings, worker_factory, receiver, ledger_view, read_topic, "run-after-deep"
    )
    assert "nests deeper than 64 levels" in letters[(0, deep.offset)].reason
    size, limit = len(canonical_json(huge.payload)), settings.max_payload_bytes
    assert f"payload is {size} bytes, over the limit of {limit}" in letters[(0, big.offset)].reason
    assert receiver.requests(key=huge.idempotency_key) == []
    assert receiver.accepted(key) == 1
    assert "x" * 100 not in worker.output()  # no payload bytes in the log


async def test_a_failing_agent_takes_the_worker_down_loudly(
    worker_factory: WorkerFactory, receiver: BackgroundSimulator, ledger_view: LedgerView
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    async with Publisher(settings) as publisher:
        requests = await publisher.run_succeeded(
            "run-boom",
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("a"), payload={})],
        )
    doomed = worker_factory.start("w1", faults=("worker.agent_raises",))
    code = await asyncio.to_thread(doomed.process.wait, 60)
    assert code == 70
    assert "delivery agent failed" in doomed.output()
    assert receiver.requests() == []
    # The record was not committed past: a healthy worker picks it up.
    worker = worker_factory.start("w1")

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        states = await ledger_view()
        key = requests[0].idempotency_key
        return key in states and states[key].status is Status.CONFIRMED

    await wait_for(done, 90, "CONFIRMED by the healthy worker")
    assert receiver.accepted(requests[0].idempotency_key) == 1
