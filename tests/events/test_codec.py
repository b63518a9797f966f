import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from uuid import uuid4

import pytest
from pydantic import ValidationError

from events import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryFailed,
    DeliveryNotSent,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
    EventDecodeError,
    RunFailed,
    RunMarkedUnknown,
    RunStarted,
    RunSucceeded,
    decode,
    encode,
)
from events.base import Event
from events.delivery import new_delivery_requested
from events.model import ALL_EVENT_TYPES, AnyDeliveryEvent, AnyExecutionEvent
from events.operator import DeliveryRedriveRequested, DeliveryResolved
from events.waiting import DeliveryHeld

DATA = Path(__file__).parent / "data"
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
REQ = new_delivery_requested(
    run_id="run-7",
    event_type="run.succeeded",
    channel="webhook",
    recipient="http://127.0.0.1:9/hook",
    payload={"text": "done", "n": [1, 2]},
    slo_seconds=60,
    producer="test",
)
COMMON = {"idempotency_key": REQ.idempotency_key, "run_id": "run-7", "producer": "test"}


def every_event() -> list[AnyExecutionEvent | AnyDeliveryEvent]:
    return [
        RunStarted(run_id="run-7", agent="a", producer="test"),
        RunSucceeded(run_id="run-7", result_hash="sha256:abc", producer="test"),
        RunFailed(run_id="run-7", error="boom", producer="test"),
        RunMarkedUnknown(run_id="run-7", reason="agent vanished", producer="test"),
        REQ,
        DeliveryClaimed(
            **COMMON,
            attempt=1,
            worker_id="w1",
            fencing_token=1,
            lease_expires_at=NOW + timedelta(seconds=30),
        ),
        DeliverySent(
            **COMMON,
            attempt=1,
            fencing_token=1,
            worker_id="w1",
            provider_message_id="m-1",
            provider_status="queued",
            http_status=202,
        ),
        DeliveryConfirmed(
            **COMMON,
            attempt=1,
            fencing_token=1,
            source="send",
            provider_message_id="m-1",
            evidence="200 from receiver",
        ),
        DeliveryNotSent(
            **COMMON,
            attempt=1,
            fencing_token=1,
            worker_id="w1",
            error_class="fenced",
            reason="the lease has 1.0s left",
        ),
        DeliveryUnknown(
            **COMMON,
            attempt=1,
            fencing_token=1,
            error_class="timeout_after_write",
            reason="read timeout",
        ),
        DeliveryReconciled(
            **COMMON, attempt=1, fencing_token=1, outcome="not_found", evidence="lookup 404"
        ),
        DeliveryRetryScheduled(
            **COMMON,
            attempt=1,
            next_attempt=2,
            retry_at=NOW,
            error_class="http_5xx",
            safety="lookup said not found",
        ),
        DeliveryFailed(**COMMON, attempts=3, error_class="http_4xx", reason="410 Gone"),
        DuplicateDeliveryRequest(
            **COMMON,
            duplicate_event_id=uuid4(),
            payload_hash=REQ.payload_hash,
            original_payload_hash=REQ.payload_hash,
            outcome="deduplicated",
        ),
        DeliveryResolved(
            **COMMON,
            operator="ana@example.com",
            reason="the receiver's log shows T-17",
            scope="key",
            fencing_token=1,
            seen_status="UNKNOWN",
            outcome="delivered",
            receiver_id="T-17",
        ),
        DeliveryHeld(**COMMON, reason="paused", detail="endpoint paused by ana", recheck_at=NOW),
        DeliveryRedriveRequested(
            **COMMON,
            operator="ana@example.com",
            reason="endpoint fixed",
            scope="recipient=https://hooks.example/x state=FAILED",
            fencing_token=3,
            seen_status="FAILED",
        ),
    ]


def test_every_event_type_is_covered() -> None:
    assert {e.type for e in every_event()} == set(ALL_EVENT_TYPES)


@pytest.mark.parametrize("event", every_event(), ids=lambda e: e.type)
def test_round_trip(event: Event) -> None:
    wire = encode(event)
    back = decode(wire)
    assert back == event
    assert type(back) is type(event)
    assert json.loads(wire)["type"] == event.type


def test_events_are_frozen_and_strict() -> None:
    event = RunSucceeded(run_id="r", result_hash="h", producer="p")
    with pytest.raises(ValidationError):
        event.run_id = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        RunSucceeded(run_id="r", result_hash="h", producer="p", surprise=1)  # type: ignore[call-arg]


def test_occurred_at_is_utc_and_must_be_aware() -> None:
    plus2 = timezone(timedelta(hours=2))
    event = RunStarted(run_id="r", producer="p", occurred_at=datetime(2026, 1, 1, 12, tzinfo=plus2))
    assert event.occurred_at.utcoffset() == timedelta(0)
    assert event.occurred_at.hour == 10
    with pytest.raises(ValidationError, match="timezone"):
        RunStarted(run_id="r", producer="p", occurred_at=datetime(2026, 1, 1))  # noqa: DTZ001


def test_stored_v1_delivery_requested_is_upcast() -> None:
    stored = (DATA / "delivery_requested_v1.json").read_bytes()
    event = decode(stored)
    assert event.type == "delivery.requested"
    assert event.schema_version == 3
    assert event.slo_seconds == 300
    assert event.payload_hash == "acc111d72d2ccd251eccb977745481920ebd09afbda7d5430b83359d2d799a1e"
    assert str(event.event_id) == "7b0c5a52-1f7e-4c51-9a8e-0d7f3c2b9e11"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected an object"),
        (b'{"run_id": "r"}', "no 'type' field"),
        (
            b'{"type": "run.teleported", "schema_version": 1}',
            "does not match any of the expected tags",
        ),
        (
            b'{"type": "run.started", "schema_version": 9, "run_id": "r", "producer": "p"}',
            "newer than this reader",
        ),
        (
            b'{"type": "run.started", "schema_version": 1, "producer": "p"}',
            "run_id: Field required",
        ),
        (None, "tombstone"),
        # A 10 KB record nested 5,000 deep: RecursionError stopped the worker for good.
        (b"[" * 5000 + b"]" * 5000, "nests deeper than 64 levels"),
        (b'{"a":' * 2000 + b"1" + b"}" * 2000, "nests deeper than 64 levels"),
        (b"[" * 70 + b"]" * 70, "nests 65 levels deep, over the limit of 64"),
        (b" " * (1024 * 1024 + 1), "over the limit of 1048576"),
    ],
)
def test_bad_bytes_raise_one_error_type_with_reason(data: bytes | None, reason: str) -> None:
    with pytest.raises(EventDecodeError) as caught:
        decode(data)
    assert reason in caught.value.reason


def test_tampered_key_or_hash_is_rejected() -> None:
    record = json.loads(encode(REQ))
    record["recipient"] = "http://127.0.0.1:9/other"
    with pytest.raises(EventDecodeError, match="idempotency_key does not match"):
        decode(json.dumps(record).encode())
    record = json.loads(encode(REQ))
    record["payload"] = {"text": "changed"}
    with pytest.raises(EventDecodeError, match="payload_hash does not match"):
        decode(json.dumps(record).encode())


def test_stored_v1_retry_scheduled_is_upcast_without_a_dedupe_rule() -> None:
    stored = (DATA / "delivery_retry_scheduled_v1.json").read_bytes()
    event = decode(stored)
    assert event.type == "delivery.retry_scheduled"
    assert event.schema_version == 2
    assert event.dedupe_rule is None
    assert "receiver_dedupes=true" in event.safety
