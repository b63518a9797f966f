"""Event sequences for projection tests, built from the real event models.

Until the worker exists these stand in for what it appends: each scenario is the log
one run would leave, with fixed times so every projection of it is predictable.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from clients.outcome_keys import operator_signer_for, signer_for
from clients.outcome_signing import needs_signature
from config.settings import Settings
from events import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryFailed,
    DeliveryReconciled,
    DeliveryRequested,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
    RunStarted,
    RunSucceeded,
    encode,
)
from events.delivery import new_delivery_requested
from events.execution import ExecutionEvent
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.operator import OperatorEvent
from events.topics import record_key
from projections.backends import open_store
from projections.database import Dump
from projections.store import Offsets

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
P = "test"


def at(seconds: float) -> datetime:
    """A fixed time, ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)


def requested(
    run_id: str, n: int, t: float, slo: int = 60, payload: object = None
) -> DeliveryRequested:
    """A webhook delivery of ``run_id`` to hook ``n``."""
    return new_delivery_requested(
        run_id=run_id,
        event_type="run.succeeded",
        channel="webhook" if n % 2 else "provider",
        recipient=f"http://127.0.0.1:9/hooks/{n}",
        payload=payload if payload is not None else {"n": n},
        slo_seconds=slo,
        producer=P,
        occurred_at=at(t),
    )


def happy(
    req: DeliveryRequested, t: float, attempt: int = 1, token: int = 1
) -> list[AnyDeliveryEvent]:
    """Claimed, sent, confirmed by the provider."""
    common = {"idempotency_key": req.idempotency_key, "run_id": req.run_id, "producer": P}
    return [
        DeliveryClaimed(
            **common,
            attempt=attempt,
            worker_id="w1",
            fencing_token=token,
            lease_expires_at=at(t + 30),
            occurred_at=at(t),
        ),
        DeliverySent(
            **common,
            attempt=attempt,
            fencing_token=token,
            worker_id="w1",
            provider_message_id=f"msg-{req.idempotency_key[:6]}-{attempt}",
            http_status=202,
            occurred_at=at(t + 1),
        ),
        DeliveryConfirmed(
            **common,
            attempt=attempt,
            fencing_token=token,
            source="send",
            provider_message_id=f"msg-{req.idempotency_key[:6]}-{attempt}",
            evidence="provider status delivered",
            occurred_at=at(t + 2),
        ),
    ]


def timeout_then_retry(req: DeliveryRequested, t: float) -> list[AnyDeliveryEvent]:
    """Attempt 1 times out (UNKNOWN), two lookups say not found, retry, attempt 2 confirmed."""
    common = {"idempotency_key": req.idempotency_key, "run_id": req.run_id, "producer": P}
    return [
        DeliveryClaimed(
            **common,
            attempt=1,
            worker_id="w1",
            fencing_token=1,
            lease_expires_at=at(t + 30),
            occurred_at=at(t),
        ),
        DeliveryUnknown(
            **common,
            attempt=1,
            fencing_token=1,
            error_class="timeout_after_write",
            reason="read timeout after request was written",
            occurred_at=at(t + 5),
        ),
        DeliveryReconciled(
            **common,
            attempt=1,
            fencing_token=1,
            outcome="not_found",
            evidence="lookup by key: 404",
            occurred_at=at(t + 6),
        ),
        DeliveryReconciled(
            **common,
            attempt=1,
            fencing_token=1,
            outcome="not_found",
            evidence="lookup by key: 404 again",
            occurred_at=at(t + 6.2),
        ),
        DeliveryRetryScheduled(
            **common,
            attempt=1,
            next_attempt=2,
            retry_at=at(t + 10),
            error_class="timeout_after_write",
            safety="provider lookup: not found twice",
            occurred_at=at(t + 6.5),
        ),
        *happy(req, t + 10, attempt=2, token=2),
    ]


def unknown(req: DeliveryRequested, t: float) -> list[AnyDeliveryEvent]:
    """Sent, then the connection reset: awaiting reconciliation."""
    common = {"idempotency_key": req.idempotency_key, "run_id": req.run_id, "producer": P}
    return [
        DeliveryClaimed(
            **common,
            attempt=1,
            worker_id="w2",
            fencing_token=1,
            lease_expires_at=at(t + 30),
            occurred_at=at(t),
        ),
        DeliveryUnknown(
            **common,
            attempt=1,
            fencing_token=1,
            error_class="reset_after_write",
            reason="reset after write",
            occurred_at=at(t + 3),
        ),
    ]


def rejected(req: DeliveryRequested, t: float) -> list[AnyDeliveryEvent]:
    """A 500 then a permanent 400: FAILED after 2 attempts."""
    common = {"idempotency_key": req.idempotency_key, "run_id": req.run_id, "producer": P}
    return [
        DeliveryClaimed(
            **common,
            attempt=1,
            worker_id="w1",
            fencing_token=1,
            lease_expires_at=at(t + 30),
            occurred_at=at(t),
        ),
        DeliveryRetryScheduled(
            **common,
            attempt=1,
            next_attempt=2,
            retry_at=at(t + 5),
            error_class="http_5xx",
            safety="receiver dedupes on webhook-id",
            occurred_at=at(t + 1),
        ),
        DeliveryClaimed(
            **common,
            attempt=2,
            worker_id="w1",
            fencing_token=2,
            lease_expires_at=at(t + 35),
            occurred_at=at(t + 5),
        ),
        DeliveryFailed(
            **common,
            attempts=2,
            error_class="http_4xx",
            reason="400 Bad Request",
            occurred_at=at(t + 6),
        ),
    ]


def duplicate(req: DeliveryRequested, t: float, conflict: bool) -> DuplicateDeliveryRequest:
    """The same key requested again (same payload, or a conflicting one)."""
    other = "0" * 64 if conflict else req.payload_hash
    return DuplicateDeliveryRequest(
        idempotency_key=req.idempotency_key,
        run_id=req.run_id,
        producer=P,
        duplicate_event_id=uuid.UUID(int=int(t * 1000)),
        payload_hash=other,
        original_payload_hash=req.payload_hash,
        outcome="conflict" if conflict else "deduplicated",
        occurred_at=at(t),
    )


def incident_log() -> list[AnyExecutionEvent | AnyDeliveryEvent]:
    """Three runs covering every delivery state and dashboard question."""
    a1, a2, a3 = requested("run-a", 1, 1), requested("run-a", 2, 1), requested("run-a", 3, 1)
    b1 = requested("run-b", 1, 100, slo=30)  # never claimed: overdue after T0+130s
    c1 = requested("run-c", 1, 200)  # confirmed, but run-c never reported a result
    a4 = requested("run-a", 4, 1)
    return [
        RunStarted(run_id="run-a", agent="reporter", producer=P, occurred_at=at(0)),
        RunSucceeded(run_id="run-a", result_hash="sha256:aa", producer=P, occurred_at=at(1)),
        a1,
        a2,
        a3,
        a4,
        *happy(a1, 2),
        *timeout_then_retry(a2, 2),
        *unknown(a3, 2),
        *rejected(a4, 2),
        duplicate(a1, 50, conflict=True),
        duplicate(a2, 51, conflict=False),
        RunStarted(run_id="run-b", agent="reporter", producer=P, occurred_at=at(99)),
        RunSucceeded(run_id="run-b", result_hash="sha256:bb", producer=P, occurred_at=at(100)),
        b1,
        RunStarted(run_id="run-c", agent="reporter", producer=P, occurred_at=at(199)),
        c1,
        *happy(c1, 201),
    ]


async def publish(
    settings: Settings,
    events: Sequence[AnyExecutionEvent | AnyDeliveryEvent],
    raw: list[tuple[str, bytes]] | None = None,
) -> None:
    """Append events (and raw ``(topic, bytes)`` records) in one Kafka transaction."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        transactional_id=f"test-{uuid.uuid4().hex}",
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
    )
    # Written as the workers write them: signed where a worker would sign (signing is on),
    # and operator events as an operator signs them.
    signer = signer_for(settings)
    operator_signer = operator_signer_for(settings)
    await producer.start()
    try:
        async with producer.transaction():
            futures = []
            for event in events:
                topic = (
                    settings.kafka.topic_runs
                    if isinstance(event, ExecutionEvent)
                    else settings.kafka.topic_deliveries
                )
                value = encode(event)
                headers = (
                    signer.headers(value) if signer is not None and needs_signature(event) else None
                )
                if isinstance(event, OperatorEvent) and operator_signer is not None:
                    headers = operator_signer.headers(value)
                futures.append(
                    await producer.send(topic, value, key=record_key(event), headers=headers)
                )
            for topic, value in raw or []:
                futures.append(await producer.send(topic, value, key=b"garbage"))
            for future in futures:
                await future
    finally:
        await producer.stop()
    await visible(settings)


async def visible(settings: Settings) -> None:
    """Wait (bounded) until read_committed readers see everything committed.

    The commit returns once the coordinator has decided; the markers reach the
    partitions a moment later, and until then the last stable offset lags behind.
    """
    committed = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka.bootstrap_servers, isolation_level="read_committed"
    )
    everything = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await committed.start()
    await everything.start()
    try:
        parts = [
            TopicPartition(topic, n)
            for topic in (settings.kafka.topic_runs, settings.kafka.topic_deliveries)
            for n in range(settings.kafka.partitions)
        ]
        for _ in range(100):
            if await committed.end_offsets(parts) == await everything.end_offsets(parts):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("committed records never became visible to read_committed")
    finally:
        await committed.stop()
        await everything.stop()


def fleet(runs: int, prefix: str = "fleet") -> list[AnyExecutionEvent | AnyDeliveryEvent]:
    """``runs`` runs with two deliveries each: one confirmed at once, one after a retry."""
    events: list[AnyExecutionEvent | AnyDeliveryEvent] = []
    for i in range(runs):
        run_id, t = f"{prefix}-{i}", i * 20.0
        first, second = requested(run_id, 1, t + 1), requested(run_id, 2, t + 1)
        events += [
            RunStarted(run_id=run_id, agent="fleet", producer=P, occurred_at=at(t)),
            RunSucceeded(run_id=run_id, result_hash=f"h{i}", producer=P, occurred_at=at(t + 1)),
            first,
            second,
            *happy(first, t + 2),
            *timeout_then_retry(second, t + 2),
        ]
    return events


def found_later(req: DeliveryRequested, t: float) -> DeliveryReconciled:
    """A lookup for attempt 1 finds the request at the provider: UNKNOWN becomes SENT."""
    return DeliveryReconciled(
        idempotency_key=req.idempotency_key,
        run_id=req.run_id,
        producer=P,
        attempt=1,
        fencing_token=1,
        outcome="found",
        provider_message_id=f"msg-{req.idempotency_key[:6]}-found",
        provider_status="queued",
        evidence="lookup by key: queued",
        occurred_at=at(t),
    )


def snapshot(dsn: str) -> tuple[Offsets, Dump]:
    """A projection's offsets and every table's rows, to compare two ledgers."""
    store = open_store(dsn)
    try:
        store.prepare("read")
        return store.load_offsets(), store.dump()
    finally:
        store.close()
