"""The worker keeps going on bad input, and dies loudly (not silently) when it cannot."""

from __future__ import annotations

import asyncio
from typing import TypedDict

from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events import DeadLetter
from events.codec import encode
from events.delivery import new_delivery_requested
from events.delivery_state import Status
from events.keys import canonical_json
from events.outcomes import ErrorClass
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import LedgerView, WorkerFactory, WorkerProcess, wait_for


class SharedFields(TypedDict):
    """The ``new_delivery_requested`` arguments this module's requests share."""

    event_type: str
    channel: str
    slo_seconds: int


async def after_the_bad_records(
    settings: Settings,
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
    run_id: str,
    dead_letters: int = 2,
) -> tuple[str, WorkerProcess, dict[tuple[int, int], DeadLetter]]:
    """Publish one good delivery behind the bad records, start a worker, and wait until it
    is CONFIRMED and ``dead_letters`` are out: the key, the worker and the dead letters by
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
        letters = await read_topic(settings.kafka.topic_deadletter, raw=True)
        confirmed = key in states and states[key].status is Status.CONFIRMED
        return confirmed and len(letters) >= dead_letters

    await wait_for(done, 90, f"the good delivery CONFIRMED and {dead_letters} dead letters")
    letters = [
        DeadLetter.model_validate_json(m.value)
        for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
    ]
    return key, worker, {(d.original_partition, d.original_offset): d for d in letters}


async def test_bad_records_are_dead_lettered_and_processing_continues(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        garbage = await producer.send_and_wait(
            settings.kafka.topic_deliveries, b"\x00not json", key=b"k1", partition=0
        )
        invalid = await producer.send_and_wait(
            settings.kafka.topic_deliveries,
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
    assert first.original_topic == settings.kafka.topic_deliveries
    assert "not JSON" in first.reason
    assert first.original_value() == b"\x00not json"
    second = by_offset[(0, invalid.offset)]
    assert "invalid event" in second.reason
    assert "idempotency_key" in second.reason
    assert receiver.accepted(key) == 1


async def test_a_deep_record_is_dead_lettered_and_a_refused_request_fails_unsent(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
) -> None:
    """Written by a raw producer, as anyone with write access to the topic can: a 10 KB
    record nested 5,000 deep (the worker used to exit 70 on it at every restart) is dead-
    lettered; well-formed requests the SDK refuses (a 700 KB payload, credentials in the
    recipient; the worker used to send them) are FAILED ``refused_request`` with the reason,
    and nothing reaches the receiver."""
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    common = SharedFields(event_type="run.succeeded", channel="webhook", slo_seconds=60)
    huge = new_delivery_requested(
        run_id="run-huge",
        recipient=receiver.webhook_url("huge"),
        payload={"blob": "x" * 700_000},
        producer="raw",
        **common,
    )
    secret_url = receiver.webhook_url("creds").replace("http://", "http://admin:s3cr3tpw@")
    creds = new_delivery_requested(
        run_id="run-creds",
        recipient=secret_url + "?api_key=K123secret",
        payload={},
        producer="raw",
        **common,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, max_request_size=2 * 1024 * 1024
    )
    await producer.start()
    try:
        deep = await producer.send_and_wait(
            settings.kafka.topic_deliveries, b"[" * 5000 + b"]" * 5000, key=b"d1", partition=0
        )
        for request in (huge, creds):
            await producer.send_and_wait(
                settings.kafka.topic_deliveries,
                encode(request),
                key=request.idempotency_key.encode(),  # its own partition, as claims use
            )
    finally:
        await producer.stop()
    key, worker, letters = await after_the_bad_records(
        settings, worker_factory, receiver, ledger_view, read_topic, "run-after-deep", 1
    )
    assert "nests deeper than 64 levels" in letters[(0, deep.offset)].reason

    async def both_failed() -> bool:
        states = await ledger_view()
        return all(
            r.idempotency_key in states and states[r.idempotency_key].status is Status.FAILED
            for r in (huge, creds)
        )

    await wait_for(both_failed, 60, "both refused requests FAILED")
    states = await ledger_view()
    size, limit = len(canonical_json(huge.payload)), settings.publisher.max_payload_bytes
    too_big, with_creds = states[huge.idempotency_key], states[creds.idempotency_key]
    assert too_big.last_error_class is ErrorClass.REFUSED_REQUEST
    assert f"payload is {size} bytes, over the limit of {limit}" in (too_big.last_reason or "")
    assert with_creds.last_error_class is ErrorClass.REFUSED_REQUEST
    assert "carries credentials" in (with_creds.last_reason or "")
    assert "s3cr3tpw" not in (with_creds.last_reason or "")
    assert receiver.requests(key=huge.idempotency_key) == []
    assert receiver.requests(key=creds.idempotency_key) == []
    assert receiver.accepted(key) == 1
    assert "x" * 100 not in worker.output()  # no payload bytes in the log
    assert "s3cr3tpw" not in worker.output()


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
