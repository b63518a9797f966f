"""No record stops a partition: schema-valid records with extreme values, written by a raw
producer as anyone with the ``agent`` role can, are refused one by one while a real worker
and a live projector keep going (ARCHITECTURE.md, "No record stops a partition")."""

from __future__ import annotations

import json
from typing import TypedDict

from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events import DeadLetter
from events.delivery import new_delivery_requested
from events.delivery_state import Status
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for


class SharedFields(TypedDict):
    """The ``new_delivery_requested`` arguments this module's requests share."""

    event_type: str
    channel: str
    producer: str


async def publish_raw(settings: Settings, values: list[tuple[bytes, bytes]]) -> list[int]:
    """Write (key, value) records to the deliveries topic as they are; their offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        sent = [
            await producer.send_and_wait(settings.kafka.topic_deliveries, value, key=key)
            for key, value in values
        ]
    finally:
        await producer.stop()
    return [meta.offset for meta in sent]


async def test_extreme_but_valid_requests_do_not_stop_the_worker_or_the_projector(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
    live_projection: LiveProjection,
) -> None:
    """The issue's two records: ``occurred_at`` 9999-12-31T23:59:59Z and ``slo_seconds``
    10**12. The worker used to exit 70 on them at every restart and the projector to exit
    with OverflowError: they are refused and dead-lettered once, the deliveries around
    them arrive exactly once at a receiver that does not dedupe, and verify agrees."""
    receiver = receiver_factory(dedupe=False)  # a second send would show
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    live_projection.settings = settings
    common = SharedFields(event_type="run.succeeded", channel="webhook", producer="raw")
    poisons = []
    for name, extreme in (
        ("far-future", {"occurred_at": "9999-12-31T23:59:59Z"}),
        ("long-slo", {"slo_seconds": 10**12}),
    ):
        valid = new_delivery_requested(
            run_id=f"run-{name}",
            recipient=receiver.webhook_url(name),
            payload={},
            slo_seconds=60,
            **common,
        )
        # Written as a raw producer would: the SDK refuses these values before sending.
        poisons.append((valid.idempotency_key, json.dumps(valid.model_dump(mode="json") | extreme)))
    await publish_raw(settings, [(key.encode(), value.encode()) for key, value in poisons])
    async with Publisher(settings) as publisher:
        good = [
            (
                await publisher.run_succeeded(
                    f"run-good-{i}",
                    "h",
                    [
                        DeliverySpec(
                            channel="webhook", recipient=receiver.webhook_url(f"g{i}"), payload={}
                        )
                    ],
                )
            )[0].idempotency_key
            for i in range(4)
        ]
    worker = worker_factory.start("w1")
    live_projection.start()

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        assert live_projection.process is not None
        assert live_projection.process.poll() is None, live_projection.log.read_text()[-3000:]
        states = await ledger_view()
        letters = [
            DeadLetter.model_validate_json(m.value)
            for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
        ]
        positions = {(x.original_partition, x.original_offset) for x in letters}
        confirmed = all(k in states and states[k].status is Status.CONFIRMED for k in good)
        return confirmed and len(positions) >= len(poisons)

    await wait_for(done, 90, "the good deliveries CONFIRMED and the poisons dead-lettered")
    letters = [
        DeadLetter.model_validate_json(m.value)
        for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
    ]
    refused = dict(poisons)
    by_key: dict[str, DeadLetter] = {}
    for letter in letters:
        value = letter.original_value() or b""
        key = next((k for k in refused if k.encode() in value), None)
        assert key is not None, letter
        # Dead letters are at least once (README, Bad records): a worker that re-reads its
        # partition (its group rejoined under load before the commit) sends the same
        # letter again, for the same position. Never a second position for one record.
        if key in by_key:
            first = by_key[key]
            assert (letter.original_partition, letter.original_offset, letter.reason) == (
                first.original_partition,
                first.original_offset,
                first.reason,
            ), f"{key} dead-lettered at two positions: {letters}"
        by_key[key] = letter
    assert set(by_key) == set(refused)
    for letter in by_key.values():
        assert letter.original_topic == settings.kafka.topic_deliveries
        assert "\n" not in letter.reason
    for key in good:
        assert receiver.accepted(key) == 1
    for key in refused:
        assert receiver.requests(key=key) == []
    states = await ledger_view()
    await live_projection.matches({k: states[k] for k in good})
    assert worker.alive()
