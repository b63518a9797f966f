"""The provider-API channel, shaped like real messaging providers.

``POST {recipient}`` with the payload as JSON and ``Idempotency-Key``; the provider answers
with its message id and a status. ``queued`` (or any other in-progress status) is SENT: the
provider has it, the recipient does not yet. ``delivered`` is CONFIRMED. ``failed`` /
``undelivered`` / ``rejected`` is a permanent REJECTED. ``GET {recipient}?idempotency_key=K``
looks a message up; only a looked-up ``delivered`` confirms.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from events.keys import canonical_json
from events.outcomes import ErrorClass
from streams.channels.base import LookupResult, OutboundDelivery, SendOutcome, SendResult
from streams.channels.outcomes import (
    lookup_request,
    non_success,
    request,
    string_field,
    transport_failure,
)

DELIVERED = "delivered"
FAILED_STATUSES = frozenset({"failed", "undelivered", "rejected"})


def is_delivered(status: str | None) -> bool:
    """Only the provider's own ``delivered`` status is authoritative."""
    return status == DELIVERED


class ProviderChannel:
    """A messaging-provider API client: message id + queued/delivered status + lookup by key."""

    name = "provider"
    # False on purpose. Providers of this shape do dedupe on Idempotency-Key (the simulator
    # does, and a repeat returns the same message id), but only within a retention window
    # that is not a contract we can hold them to. What this shape does promise is a lookup
    # by idempotency key, so UNKNOWN is settled by that lookup (not_found = provably not
    # accepted), never by a blind retry. The dedupe remains a second line of defence.
    receiver_dedupes = False

    def __init__(self, client: httpx.AsyncClient, *, clock: Callable[[], float] = time.time):
        self._client = client
        self._clock = clock

    async def send(self, delivery: OutboundDelivery) -> SendResult:
        """POST one attempt with ``Idempotency-Key`` and classify the provider's answer."""
        what = f"POST {delivery.recipient}"
        headers = {
            "content-type": "application/json",
            "idempotency-key": delivery.idempotency_key,
        }
        try:
            answer = await request(
                self._client,
                "POST",
                delivery.recipient,
                content=canonical_json(delivery.payload),
                headers=headers,
            )
        except httpx.InvalidURL as exc:
            return SendResult(SendOutcome.REJECTED, f"{what}: {exc}", ErrorClass.INVALID_RECIPIENT)
        except httpx.RequestError as exc:
            return transport_failure(exc, what)
        if not 200 <= answer.status <= 299:
            return non_success(answer, what, self._clock)
        body = answer.json_object()
        message_id = string_field(body, "id")
        status = string_field(body, "status")
        evidence = f"{what} -> {answer.status}, id {message_id}, status {status}"
        if message_id is None or status is None:
            # The provider took the request but we cannot read what it made of it: it has
            # the message, so this is SENT, and the lookup must settle the rest.
            return SendResult(
                SendOutcome.SENT,
                f"{evidence}; unreadable answer: {answer.excerpt()}"[:1000],
                ErrorClass.PROTOCOL_ERROR,
                answer.status,
                message_id,
                status,
            )
        if is_delivered(status):
            outcome = SendOutcome.CONFIRMED
            error = None
        elif status in FAILED_STATUSES:
            outcome = SendOutcome.REJECTED
            error = ErrorClass.PROVIDER_FAILED
        else:
            outcome = SendOutcome.SENT
            error = None
        return SendResult(outcome, evidence, error, answer.status, message_id, status)

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """GET ``{recipient}?idempotency_key=K``: found (delivered iff status is delivered)."""
        return await lookup_request(
            self._client,
            delivery.recipient,
            {"idempotency-key": delivery.idempotency_key},
            {"idempotency_key": delivery.idempotency_key},
            delivered=is_delivered,
        )
