"""Kafka record keys: which key each topic is partitioned by."""

from __future__ import annotations

from events.model import DeliveryEvent, ExecutionEvent


def record_key(event: ExecutionEvent | DeliveryEvent) -> bytes:
    """The partitioning key: ``run_id`` for execution events, the idempotency key otherwise."""
    if isinstance(event, DeliveryEvent):
        return event.idempotency_key.encode("ascii")
    return event.run_id.encode("utf-8")
