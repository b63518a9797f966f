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
from streams.channels.base import (
    FENCING_TOKEN_HEADER,
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.outcomes import (
    DeadlineExceeded,
    attempt_failure,
    lookup_request,
    non_success,
    request,
    string_field,
)
from streams.channels.write_guard import SendRefused, WriteGuard

DELIVERED = "delivered"
FAILED_STATUSES = frozenset({"failed", "undelivered", "rejected"})


def is_delivered(status: str | None) -> bool:
    """Only the provider's own ``delivered`` status is authoritative."""
    return status == DELIVERED


class ProviderChannel:
    """A messaging-provider API client: message id + queued/delivered status + lookup by key."""

    name = "provider"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        deadline_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._clock = clock
        self._deadline_s = deadline_s

    def receiver_dedupes(self, recipient: str) -> bool:
        """False on purpose. Providers of this shape do dedupe on Idempotency-Key, but only
        within a retention window that is not a contract we can hold them to. What they
        promise is a lookup by key, so UNKNOWN is settled by that lookup, never by a blind
        retry; their dedupe remains a second line of defence."""
        del recipient
        return False

    def settle_s(self, recipient: str) -> float | None:
        """The default settle window applies."""
        del recipient
        return None

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """POST one attempt with ``Idempotency-Key`` and classify the provider's answer."""
        what = f"POST {delivery.recipient}"
        headers = {
            "content-type": "application/json",
            "idempotency-key": delivery.idempotency_key,
            FENCING_TOKEN_HEADER: str(delivery.fencing_token),
        }
        try:
            answer = await request(
                self._client,
                "POST",
                delivery.recipient,
                deadline_s=self._deadline_s,
                guard=guard,
                content=canonical_json(delivery.payload),
                headers=headers,
            )
        except (httpx.RequestError, httpx.InvalidURL, SendRefused, DeadlineExceeded) as exc:
            return attempt_failure(exc, what)
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
            deadline_s=self._deadline_s,
            delivered=is_delivered,
            failed=FAILED_STATUSES.__contains__,
        )


def adapter(build: AdapterBuild) -> ProviderChannel:
    """The provider channel's adapter factory (its plugin: events/channels/builtin.py)."""
    return ProviderChannel(build.client, deadline_s=build.deadline_s)
