"""Across the change to RFC 8785 payload hashes, on the real broker with a real worker: a
request written before it (schema v2, the unprefixed sorted-key hash, bytes as the old
publisher wrote them) is delivered, and requesting it again afterwards through today's SDK
is a duplicate when the payload is the same (also as another language spells it, 1 for
1.0) and a conflict when it is not; the receiver gets it once."""

from __future__ import annotations

import json

from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher
from events.delivery import DuplicateDeliveryRequest
from events.delivery_state import Status
from events.keys import idempotency_key
from events.payload_hashes import LEGACY, hash_under
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for

RUN = "run-before-jcs"
# Spelled differently by the two schemes: 1.0, and keys whose UTF-16 and code-point
# orders differ (U+1F600 and U+FB01).
PAYLOAD = {"amount": 1.0, "text": "done", "\U0001f600": "astral", "\ufb01": 2}


def as_written_before(recipient: str) -> tuple[bytes, bytes]:
    """A v2 DeliveryRequested as the publisher before RFC 8785 wrote it: key and value
    (tests/events/data/delivery_requested_v2.json is one, from that code)."""
    key = idempotency_key(RUN, "run.succeeded", "webhook", recipient)
    record = {
        "schema_version": 2,
        "event_id": "3f1d2c4b-5a69-4b7e-8c1d-2e3f4a5b6c7d",
        "occurred_at": "2026-11-01T09:00:00Z",
        "producer": "agent-7",
        "idempotency_key": key,
        "run_id": RUN,
        "type": "delivery.requested",
        "event_type": "run.succeeded",
        "channel": "webhook",
        "recipient": recipient,
        "payload": PAYLOAD,
        "payload_hash": hash_under(LEGACY, PAYLOAD),
        "slo_seconds": 300,
    }
    value = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    return key.encode(), value


async def test_a_request_from_before_the_upgrade_repeated_after_it_is_no_false_conflict(
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    recipient = receiver.webhook_url("legacy")
    key, value = as_written_before(recipient)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(settings.kafka.topic_deliveries, value, key=key)
    finally:
        await producer.stop()
    worker = worker_factory.start("w1")

    async def state_is(status: Status, duplicates: int = 0, conflicts: int = 0) -> bool:
        assert worker.alive(), worker.output()[-3000:]
        state = (await ledger_view()).get(key.decode())
        return (
            state is not None
            and state.status is status
            and (state.duplicates, state.conflicts) == (duplicates, conflicts)
        )

    await wait_for(lambda: state_is(Status.CONFIRMED), 60, "the old request CONFIRMED")

    def spec(payload: object) -> DeliverySpec:
        return DeliverySpec(channel="webhook", recipient=recipient, payload=payload)

    async with Publisher(settings, producer_name="agent-7") as publisher:
        for payload in (PAYLOAD, {**PAYLOAD, "amount": 1}, {**PAYLOAD, "text": "changed"}):
            (request,) = await publisher.run_succeeded(RUN, "sha256:r", [spec(payload)])
            assert request.payload_hash.startswith("jcs-sha256:")

    await wait_for(
        lambda: state_is(Status.CONFIRMED, duplicates=2, conflicts=1),
        60,
        "two duplicates and one conflict recorded",
    )
    reports = [
        e
        for e in await read_topic(settings.kafka.topic_deliveries)
        if isinstance(e, DuplicateDeliveryRequest)
    ]
    assert [r.outcome for r in reports] == ["deduplicated", "deduplicated", "conflict"]
    same, also, changed = reports
    assert same.payload_hash == same.original_payload_hash
    assert also.payload_hash == also.original_payload_hash == same.payload_hash
    assert same.payload_hash.startswith("jcs-sha256:")
    assert changed.payload_hash != changed.original_payload_hash
    assert receiver.accepted(key.decode()) == 1
