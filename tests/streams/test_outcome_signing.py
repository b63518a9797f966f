"""Signed outcome events: with outcome signing on, only what a worker signed moves a
delivery. A raw producer (an agent's principal may write ``ledger.deliveries``) appends
a ``DeliveryConfirmed`` with a forged provider id for a FAILED delivery; the old
projection showed it CONFIRMED and ``ledger verify`` called that identical."""

from __future__ import annotations

import asyncio
import base64
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from clients import DeliverySpec, Publisher
from clients.outcome_signing import (
    HEADER,
    OutcomeSigner,
    OutcomeVerifier,
    new_pair,
    private_key,
    public_key,
)
from config.settings import Settings, changed
from events import DeadLetter, encode
from events.delivery import DeliveryConfirmed, DeliveryRequested
from ledger.simulator.faults import Fault, FaultKind
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for

SIGNING, VERIFY = new_pair()
OTHER_SIGNING, OTHER_VERIFY = new_pair()


def forged_confirmation(request: DeliveryRequested) -> DeliveryConfirmed:
    return DeliveryConfirmed(
        idempotency_key=request.idempotency_key,
        run_id=request.run_id,
        producer="forger",
        attempt=1,
        fencing_token=1,
        source="send",
        provider_message_id="forged-id",
        evidence="forged",
    )


def test_a_signature_verifies_only_with_its_pair_and_only_where_one_is_needed() -> None:
    confirmed = forged_confirmation(_request())
    value = encode(confirmed)
    headers = OutcomeSigner(private_key(SIGNING)).headers(value)
    rotation = OutcomeVerifier([public_key(OTHER_VERIFY), public_key(VERIFY)])
    assert rotation.refuses(confirmed, value, headers) is None
    assert "no verify key accepts" in (
        OutcomeVerifier([public_key(OTHER_VERIFY)]).refuses(confirmed, value, headers) or ""
    )
    assert "carries no outcome signature" in (rotation.refuses(confirmed, value, []) or "")
    tampered = value.replace(b"forged-id", b"other--id")
    assert "no verify key accepts" in (rotation.refuses(confirmed, tampered, headers) or "")
    # The agents' requests are not the workers' to sign.
    request = _request()
    assert rotation.refuses(request, encode(request), []) is None


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("signing_key", "not base64!", "the outcome signing key is not base64"),
        ("signing_key", base64.b64encode(b"short").decode(), "is 5 bytes, not the 32"),
        ("verify_keys", ["x" * 44], "an outcome verify key is"),
    ],
)
def test_a_bad_key_is_named_and_not_repeated(field: str, value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        Settings(signing={field: value})
    if isinstance(value, str) and len(value) > 8:
        assert value not in str(refused.value)


def _request() -> DeliveryRequested:
    from events.delivery import new_delivery_requested

    return new_delivery_requested(
        run_id=f"r-{uuid.uuid4().hex[:6]}",
        event_type="run.succeeded",
        channel="webhook",
        recipient="https://hooks.example/x",
        payload={},
        slo_seconds=60,
        producer="p",
    )


async def test_a_forged_outcome_is_dead_lettered_and_moves_nothing(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = changed(
        receiver.settings(worker_factory.settings),
        {"signing.signing_key": SecretStr(SIGNING), "signing.verify_keys": [VERIFY]},
    )
    worker_factory.settings = settings
    reader = changed(settings, {"signing.signing_key": None})  # readers: no key
    live_projection.settings = reader
    async with Publisher(settings) as publisher:
        [rejected, delivered] = await publisher.run_succeeded(
            "run-forged",
            "h",
            [
                DeliverySpec(channel="webhook", recipient=receiver.webhook_url("no"), payload={}),
                DeliverySpec(channel="webhook", recipient=receiver.webhook_url("ok"), payload={}),
            ],
        )
    receiver.add_fault(Fault(kind=FaultKind.REJECT, key=rejected.idempotency_key, status=400))
    worker = worker_factory.start("w1")
    live_projection.start()

    async def settled() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        statuses = await asyncio.to_thread(_statuses, live_projection)
        return statuses.get(rejected.idempotency_key) == "FAILED" and (
            statuses.get(delivered.idempotency_key) == "CONFIRMED"
        )

    await wait_for(settled, 90, "FAILED and CONFIRMED, from signed outcomes")

    # Forged: unsigned, and signed with a key that is not the workers'.
    forged = forged_confirmation(rejected)
    other = forged.model_copy(update={"event_id": uuid.uuid4()})
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        key = rejected.idempotency_key.encode()
        unsigned = await producer.send_and_wait(
            settings.kafka.topic_deliveries, encode(forged), key=key
        )
        value = encode(other)
        wrong = await producer.send_and_wait(
            settings.kafka.topic_deliveries,
            value,
            key=key,
            headers=OutcomeSigner(private_key(OTHER_SIGNING)).headers(value),
        )
    finally:
        await producer.stop()

    async def dead_lettered() -> dict[int, DeadLetter]:
        letters = [
            DeadLetter.model_validate_json(m.value)
            for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
        ]
        return {d.original_offset: d for d in letters if d.original_partition == unsigned.partition}

    async def both_refused() -> bool:
        found = await dead_lettered()
        return unsigned.offset in found and wrong.offset in found

    await wait_for(both_refused, 60, "both forged outcomes dead-lettered by the worker")
    found = await dead_lettered()
    assert "carries no outcome signature" in found[unsigned.offset].reason
    assert "no verify key accepts" in found[wrong.offset].reason
    # A later signed event of the same delivery still folds (the worker keeps going), and
    # the forged ones moved nothing: not in the worker's state, not in the projection.
    await asyncio.sleep(2)  # the projector has read past them
    statuses = await asyncio.to_thread(_statuses, live_projection)
    assert statuses[rejected.idempotency_key] == "FAILED"
    assert receiver.accepted(rejected.idempotency_key) == 0
    assert receiver.accepted(delivered.idempotency_key) == 1
    assert len(receiver.requests(key=delivered.idempotency_key)) == 1
    # Every outcome the worker wrote carries a signature.
    signed = [
        m
        for m in await read_topic(settings.kafka.topic_deliveries, raw=True)
        if m.offset not in (unsigned.offset, wrong.offset) or m.partition != unsigned.partition
    ]
    outcomes = [m for m in signed if b'"delivery.requested"' not in m.value]
    assert outcomes
    assert all(any(name == HEADER for name, _ in (m.headers or ())) for m in outcomes)
    await live_projection.verify()
    assert SIGNING not in worker.output()


def _statuses(projection: LiveProjection) -> dict[str, str]:
    try:
        return {k: v[0] for k, v in projection.statuses().items()}
    except Exception:  # the projector may not have created its tables yet
        return {}


async def test_a_worker_that_checks_but_cannot_sign_refuses_to_start(
    worker_factory: WorkerFactory,
) -> None:
    for update, says in (
        (
            {"signing.verify_keys": [VERIFY], "signing.signing_key": None},
            "outcome signing is on but this worker has no signing key",
        ),
        (
            {"signing.verify_keys": [VERIFY], "signing.signing_key": OTHER_SIGNING},
            "is not the pair of any LEDGER_SIGNING__VERIFY_KEYS",
        ),
    ):
        worker_factory.settings = changed(worker_factory.settings, update)
        worker = worker_factory.start("w1")
        code = await asyncio.to_thread(worker.process.wait, 60)
        output = worker.output()
        assert code == 2, output
        assert says in output
        assert "Traceback" not in output
        assert OTHER_SIGNING not in output
