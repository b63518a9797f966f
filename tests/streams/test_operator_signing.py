"""Signed operator events (issue 26): only what an operator key signed moves a delivery.

A FAILED delivery is redriven four times on a real broker: unsigned, signed with the
WORKER's outcome key, signed with a random key, and signed with the operator key. A
running worker dead-letters the first three with the reason; the projector skips them (no
operator_actions row, the delivery still FAILED, nothing sent); the fourth applies: the
worker makes a new attempt and the receiver gets it once.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer

from clients import DeliverySpec, Publisher
from clients.operator_actions import OperatorLog
from clients.outcome_keys import signer_for
from clients.outcome_signing import OutcomeSigner, new_pair, private_key
from events import DeadLetter, encode
from events.operator import DeliveryRedriveRequested
from ledger.simulator.faults import Fault, FaultKind
from projections import open_store
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, wait_for

RANDOM_SIGNING, _ = new_pair()


def _read(projection: LiveProjection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    store = open_store(projection.dsn)
    try:
        store.prepare("read")
        return store.rows(sql, params)
    finally:
        store.close()


async def _rows(projection: LiveProjection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    try:
        return await asyncio.to_thread(_read, projection, sql, params)
    except Exception:
        return []


async def test_forged_operator_events_are_dead_lettered_and_a_signed_one_applies(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    receiver = receiver_factory(dedupe=False)
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = live_projection.settings = settings
    async with Publisher(settings) as publisher:
        [request] = await publisher.run_succeeded(
            "run-redrive",
            "h",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("r"), payload={})],
        )
    key = request.idempotency_key
    # The endpoint refuses the first attempt for good (400): FAILED.
    receiver.add_fault(Fault(kind=FaultKind.REJECT, key=key, status=400))
    worker = worker_factory.start("w1")
    live_projection.start()
    row_sql = (
        "SELECT status, fencing_token, attempts, redrives FROM deliveries WHERE idempotency_key = ?"
    )

    async def row() -> dict[str, Any]:
        assert worker.alive(), worker.output()[-3000:]
        found = await _rows(live_projection, row_sql, (key,))
        return found[0] if found else {}

    async def failed() -> bool:
        return (await row()).get("status") == "FAILED"

    await wait_for(failed, 90, "the rejected delivery FAILED")
    token = (await row())["fencing_token"]

    def redrive(operator: str = "mallory", producer: str = "forger") -> DeliveryRedriveRequested:
        return DeliveryRedriveRequested(
            idempotency_key=key,
            run_id=request.run_id,
            producer=producer,
            operator=operator,
            reason="send it again",
            scope="key",
            fencing_token=token,
            seen_status="FAILED",
            event_id=uuid.uuid4(),
        )

    def signed(signer: OutcomeSigner | None) -> tuple[bytes, list[tuple[str, bytes]] | None]:
        value = encode(redrive())
        return value, None if signer is None else signer.headers(value)

    forgeries = {
        "unsigned": signed(None),
        "worker's key": signed(signer_for(settings)),  # the outcome key signs no action
        "random key": signed(OutcomeSigner(private_key(RANDOM_SIGNING))),
    }
    assert forgeries["worker's key"][1] is not None
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    offsets: dict[str, int] = {}
    try:
        for name, forged in forgeries.items():
            meta = await producer.send_and_wait(
                settings.kafka.topic_deliveries, forged[0], key=key.encode(), headers=forged[1]
            )
            offsets[name], partition = meta.offset, meta.partition
    finally:
        await producer.stop()

    async def letters() -> dict[int, DeadLetter]:
        found = [
            DeadLetter.model_validate_json(m.value)
            for m in await read_topic(settings.kafka.topic_deadletter, raw=True)
        ]
        return {
            d.original_offset: d
            for d in found
            if d.original_partition == partition and d.detected_by != "projector"
        }

    async def all_refused() -> bool:
        return set(offsets.values()) <= set(await letters())

    await wait_for(all_refused, 60, "the three forged redrives dead-lettered by the worker")
    found = await letters()
    assert "delivery.redrive_requested carries no operator signature" in (
        found[offsets["unsigned"]].reason
    )
    for name in ("worker's key", "random key"):
        assert "has an operator signature no verify key accepts" in found[offsets[name]].reason
    # The projector skipped them (with the same reasons), and nothing moved.
    await asyncio.sleep(2)
    skipped = await _rows(
        live_projection,
        "SELECT record_offset, reason FROM skipped_records WHERE kafka_partition = ?",
        (partition,),
    )
    assert {r["record_offset"] for r in skipped} >= set(offsets.values())
    assert await _rows(live_projection, "SELECT * FROM operator_actions") == []
    assert (await row())["status"] == "FAILED"
    assert len(receiver.requests(key=key)) == 1
    assert receiver.accepted(key) == 0

    # The operator's own, signed with the operator key: applied, sent again, once.
    action = redrive(operator="ana", producer="ledger-operator")
    async with OperatorLog(settings) as log:
        await log.append([action])

    async def confirmed() -> bool:
        return (await row()).get("status") == "CONFIRMED"

    await wait_for(confirmed, 90, "the signed redrive applied, the new attempt CONFIRMED")
    final = await row()
    assert (final["attempts"], final["redrives"]) == (2, 1)
    assert final["fencing_token"] > token
    actions = await _rows(
        live_projection, "SELECT event_id, operator, result FROM operator_actions"
    )
    assert actions == [{"event_id": str(action.event_id), "operator": "ana", "result": "applied"}]
    assert receiver.accepted(key) == 1
    assert len(receiver.requests(key=key)) == 2
    await live_projection.verify()
