"""Delivery events on ``ledger.deliveries``: what we know about each outbound side effect."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal
from uuid import UUID

from pydantic import Field, JsonValue, field_validator, model_validator

from events.base import Event, check_key, check_run_id
from events.bounds import (
    MAX_COUNTER,
    MAX_ID_CHARS,
    MAX_RECIPIENT_CHARS,
    MAX_SLO_SECONDS,
    MAX_TEXT_CHARS,
    Counter,
    Moment,
    Ordinal,
)
from events.channels import check_recipient
from events.keys import idempotency_key
from events.outcomes import ErrorClass, LookupOutcome
from events.payload_hashes import PayloadHash, matches, payload_hash


class DeliveryEvent(Event):
    """An event about one logical delivery, keyed by its idempotency key."""

    idempotency_key: str
    run_id: str

    @field_validator("idempotency_key")
    @classmethod
    def _key(cls, value: str) -> str:
        return check_key(value)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        return check_run_id(value)


class DeliveryRequested(DeliveryEvent):
    """A logical delivery exists (written with ``RunSucceeded`` in one transaction).

    Version 2 added ``payload_hash`` and ``slo_seconds``; version 3 writes the hash over
    RFC 8785 JSON, prefixed ``jcs-sha256:`` (events/payload_hashes.py). Older records are
    upcast, their hashes kept as stored: an unprefixed hash is the legacy scheme's.
    """

    TYPE: ClassVar[str] = "delivery.requested"
    SCHEMA_VERSION: ClassVar[int] = 3
    type: Literal["delivery.requested"] = "delivery.requested"
    schema_version: int = 3
    event_type: str = Field(pattern=r"^[A-Za-z0-9._\-]{1,100}$")
    channel: str = Field(min_length=1, max_length=64)
    recipient: str = Field(min_length=1, max_length=MAX_RECIPIENT_CHARS)
    payload: JsonValue
    payload_hash: PayloadHash
    slo_seconds: int = Field(ge=1, le=MAX_SLO_SECONDS)

    @model_validator(mode="after")
    def _consistent(self) -> DeliveryRequested:
        check_recipient(self.channel, self.recipient)
        expected = idempotency_key(self.run_id, self.event_type, self.channel, self.recipient)
        if self.idempotency_key != expected:
            raise ValueError(
                "idempotency_key does not match sha256(run_id:event_type:channel:recipient)"
            )
        if not matches(self.payload_hash, self.payload):
            raise ValueError("payload_hash does not match the canonical hash of payload")
        return self


class DeliveryClaimed(DeliveryEvent):
    """Attempt N may be made by worker W until ``lease_expires_at``, under a fencing token."""

    TYPE: ClassVar[str] = "delivery.claimed"
    type: Literal["delivery.claimed"] = "delivery.claimed"
    attempt: Ordinal
    worker_id: str = Field(min_length=1, max_length=200)
    fencing_token: Ordinal
    lease_expires_at: Moment


class DeliverySent(DeliveryEvent):
    """The provider accepted the request; not yet authoritative."""

    TYPE: ClassVar[str] = "delivery.sent"
    type: Literal["delivery.sent"] = "delivery.sent"
    attempt: Ordinal
    fencing_token: Ordinal
    worker_id: str = Field(min_length=1, max_length=200)
    provider_message_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    provider_status: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    http_status: int | None = Field(default=None, ge=0, le=999)


class DeliveryConfirmed(DeliveryEvent):
    """Authoritative acknowledgement by the receiver or provider."""

    TYPE: ClassVar[str] = "delivery.confirmed"
    type: Literal["delivery.confirmed"] = "delivery.confirmed"
    attempt: Ordinal
    fencing_token: Ordinal
    source: Literal["send", "reconciliation"]
    provider_message_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    evidence: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class DeliveryNotSent(DeliveryEvent):
    """Attempt N under this fencing token wrote nothing: the sender refused before the
    first byte (the lease rule), or the deadline struck before it. Evidence enough for
    the next attempt, no lookup needed: only the claim's holder could have written it."""

    TYPE: ClassVar[str] = "delivery.not_sent"
    type: Literal["delivery.not_sent"] = "delivery.not_sent"
    attempt: Ordinal
    fencing_token: Ordinal
    worker_id: str = Field(min_length=1, max_length=200)
    error_class: ErrorClass
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class DeliveryUnknown(DeliveryEvent):
    """We cannot know whether the request left; never retried blindly."""

    TYPE: ClassVar[str] = "delivery.unknown"
    type: Literal["delivery.unknown"] = "delivery.unknown"
    attempt: Ordinal
    fencing_token: Ordinal
    error_class: ErrorClass
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class DeliveryReconciled(DeliveryEvent):
    """What the provider's lookup by idempotency key said."""

    TYPE: ClassVar[str] = "delivery.reconciled"
    type: Literal["delivery.reconciled"] = "delivery.reconciled"
    attempt: Ordinal
    fencing_token: Ordinal
    outcome: LookupOutcome
    provider_message_id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    provider_status: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    evidence: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class DeliveryRetryScheduled(DeliveryEvent):
    """The next attempt is due at ``retry_at``; ``safety`` says why a retry is safe.

    ``dedupe_rule`` names the channel's dedupe rule (``events.channels.DedupeRule``) when
    the receiver's declared dedupe is what makes it safe (a retry after UNKNOWN without a
    lookup); None otherwise. Version 2 added it; version 1 records are upcast to None.
    """

    TYPE: ClassVar[str] = "delivery.retry_scheduled"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["delivery.retry_scheduled"] = "delivery.retry_scheduled"
    schema_version: int = 2
    attempt: Ordinal
    next_attempt: int = Field(ge=2, le=MAX_COUNTER)
    retry_at: Moment
    error_class: ErrorClass
    safety: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    dedupe_rule: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]{0,39}$")


class DeliveryFailed(DeliveryEvent):
    """Final: permanently rejected, or attempts exhausted."""

    TYPE: ClassVar[str] = "delivery.failed"
    type: Literal["delivery.failed"] = "delivery.failed"
    attempts: Counter
    error_class: ErrorClass
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class DuplicateDeliveryRequest(DeliveryEvent):
    """The same key was requested again, with the same payload or a conflicting one.

    Both hashes are under one scheme (events/payload_hashes.py ``comparable``), so
    ``outcome`` is "deduplicated" exactly when they are equal. Version 2 allows the
    ``jcs-sha256:`` hashes; version 1 records (unprefixed hashes) are upcast as they are.
    """

    TYPE: ClassVar[str] = "delivery.duplicate_requested"
    SCHEMA_VERSION: ClassVar[int] = 2
    type: Literal["delivery.duplicate_requested"] = "delivery.duplicate_requested"
    schema_version: int = 2
    duplicate_event_id: UUID
    payload_hash: PayloadHash
    original_payload_hash: PayloadHash
    outcome: Literal["deduplicated", "conflict"]


def new_delivery_requested(
    *,
    run_id: str,
    event_type: str,
    channel: str,
    recipient: str,
    payload: Any,
    slo_seconds: int,
    producer: str,
    occurred_at: datetime | None = None,
) -> DeliveryRequested:
    """Build a ``DeliveryRequested`` with its key and payload hash derived, not supplied."""
    extra: dict[str, Any] = {} if occurred_at is None else {"occurred_at": occurred_at}
    return DeliveryRequested(
        idempotency_key=idempotency_key(run_id, event_type, channel, recipient),
        run_id=run_id,
        event_type=event_type,
        channel=channel,
        recipient=recipient,
        payload=payload,
        payload_hash=payload_hash(payload),
        slo_seconds=slo_seconds,
        producer=producer,
        **extra,
    )
