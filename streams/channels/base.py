"""The contract every channel adapter keeps: send with the idempotency key, look up by it.

A send never raises for delivery problems: it returns a ``SendResult`` whose ``outcome``
says what we now know, and whose ``error_class`` names why (recorded in the log).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import JsonValue


class SendOutcome(enum.StrEnum):
    """What a single send attempt proved."""

    CONFIRMED = "confirmed"  # authoritative acknowledgement (receiver 2xx / provider delivered)
    SENT = "sent"  # provider accepted (e.g. "queued"), not yet authoritative
    UNKNOWN = "unknown"  # the request may have left (timeout/reset after write)
    NOT_SENT = "not_sent"  # provably nothing left (connection refused, DNS failure)
    TRANSIENT = "transient"  # 429 / 5xx: the receiver answered "not now"; may have accepted
    REJECTED = "rejected"  # permanent 4xx


class ErrorClass(enum.StrEnum):
    """Stable names for why an attempt did not confirm; they go into events."""

    CONNECT_REFUSED = "connect_refused"
    DNS_FAILURE = "dns_failure"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT_AFTER_WRITE = "timeout_after_write"
    RESET_AFTER_WRITE = "reset_after_write"
    HTTP_4XX = "http_4xx"
    HTTP_408 = "http_408"
    HTTP_409 = "http_409"
    HTTP_425 = "http_425"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    LEASE_EXPIRED = "lease_expired"
    PROTOCOL_ERROR = "protocol_error"
    # Added with the HTTP adapters (additive; earlier names unchanged):
    CONNECT_FAILED = "connect_failed"  # no connection for another reason (unreachable, TLS)
    POOL_TIMEOUT = "pool_timeout"  # no free pooled connection in time; nothing was written
    INVALID_RECIPIENT = "invalid_recipient"  # the URL cannot be requested at all
    HTTP_3XX = "http_3xx"  # a redirect: we never follow one with a signed POST
    PROVIDER_FAILED = "provider_failed"  # the provider reports the message failed/undelivered


@dataclass(frozen=True)
class OutboundDelivery:
    """What an adapter needs to send one attempt of one logical delivery."""

    idempotency_key: str
    run_id: str
    event_type: str
    channel: str
    recipient: str
    payload: JsonValue
    attempt: int
    fencing_token: int


@dataclass(frozen=True)
class SendResult:
    """The classified result of one attempt."""

    outcome: SendOutcome
    evidence: str
    error_class: ErrorClass | None = None
    http_status: int | None = None
    provider_message_id: str | None = None
    provider_status: str | None = None
    retry_after_s: float | None = None


LookupOutcome = Literal["found", "not_found", "unsupported", "lookup_error"]


@dataclass(frozen=True)
class LookupResult:
    """What the receiver/provider says about an idempotency key."""

    outcome: LookupOutcome
    evidence: str
    provider_message_id: str | None = None
    provider_status: str | None = None
    delivered: bool = False  # authoritative: the logical event reached its recipient


class Channel(Protocol):
    """A delivery channel adapter."""

    name: str
    # True when receivers dedupe on the idempotency key (Standard Webhooks webhook-id),
    # which makes a retry after UNKNOWN safe even without a lookup.
    receiver_dedupes: bool

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        """Make one attempt, with the idempotency key; classify what happened."""
        ...

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """Ask the receiver/provider whether it accepted this idempotency key."""
        ...
