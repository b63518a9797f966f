"""The webhook channel: a Standard Webhooks POST, signed, carrying the idempotency key.

Headers: ``webhook-id`` (the idempotency key), ``webhook-timestamp`` (unix seconds, fresh
per attempt), ``webhook-signature`` (one ``v1,`` + base64 HMAC-SHA256 over
``id.timestamp.body`` per active secret of the endpoint, by the ``standardwebhooks``
library), ``Idempotency-Key``, and the attempt's ``fencing-token`` with its
``fencing-token-signature``. Lookups carry ``lookup-timestamp`` and ``lookup-signature``.
Both extra signatures follow the receiver contract (``events/contract.py``, README).
Sends and lookups carry the W3C ``traceparent`` of the delivery's trace when it has one
(clients/tracing.py), outside every signature.
The body is the delivery's payload as canonical JSON, so every attempt of one logical
event carries the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import quote

import httpx

from clients.tracing import TRACEPARENT
from config.parts import ChannelSettings
from events.contract import (
    FENCING_TOKEN_HEADER,
    FENCING_TOKEN_SIGNATURE_HEADER,
    fencing_token_signature,
    lookup_headers,
)
from events.keys import canonical_json
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.base import (
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.endpoints import EndpointOverlay, ResolvedEndpoint, WebhookEndpoints
from streams.channels.outcomes import (
    DeadlineExceeded,
    attempt_failure,
    lookup_request,
    non_success,
    request,
    string_field,
)
from streams.channels.signature import signature_header
from streams.channels.write_guard import SendRefused, WriteGuard


class WebhookChannel:
    """Standard Webhooks sender. Receivers are asked to dedupe on ``webhook-id``, but only
    an endpoint that declares it (``receiver_dedupes``) is trusted to."""

    name = "webhook"

    def __init__(
        self,
        client: httpx.AsyncClient,
        settings: ChannelSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._clock = clock
        self._deadline_s = settings.deadline_for(self.name)
        self._settings = settings
        self._endpoints = WebhookEndpoints(settings)

    def follow(self, overlay: EndpointOverlay) -> None:
        """Take endpoints from ``overlay`` (the registry) too, as they change."""
        self._endpoints = WebhookEndpoints(self._settings, overlay)

    def endpoint_for(self, recipient: str) -> ResolvedEndpoint:
        """The configuration for ``recipient`` (see ``WebhookEndpoints.for_recipient``)."""
        return self._endpoints.for_recipient(recipient)

    def receiver_dedupes(self, recipient: str) -> bool:
        """Only what the endpoint's configuration declares."""
        return self.endpoint_for(recipient).receiver_dedupes

    def settle_s(self, recipient: str) -> float | None:
        """The endpoint's settle window, if it names one."""
        return self.endpoint_for(recipient).settle_s

    def signed_request(
        self, delivery: OutboundDelivery, timestamp: int
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one attempt, signed with each of the endpoint's secrets."""
        body = canonical_json(delivery.payload)
        endpoint = self.endpoint_for(delivery.recipient)
        signers = endpoint.signers
        headers = {
            "content-type": "application/json",
            "webhook-id": delivery.idempotency_key,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature_header(
                signers, delivery.idempotency_key, timestamp, body
            ),
            "idempotency-key": delivery.idempotency_key,
            FENCING_TOKEN_HEADER: str(delivery.fencing_token),
            FENCING_TOKEN_SIGNATURE_HEADER: fencing_token_signature(
                endpoint.keys, delivery.idempotency_key, timestamp, delivery.fencing_token
            ),
        }
        if delivery.traceparent is not None:
            # Unsigned, like any trace context: the signatures cover id, timestamp and body
            # (and the token), so a receiver that ignores it verifies the same.
            headers[TRACEPARENT] = delivery.traceparent
        return body, headers

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """POST one signed attempt and classify what happened (never raises for delivery)."""
        what = f"POST {delivery.recipient}"
        if not self.endpoint_for(delivery.recipient).signers:
            return SendResult(
                SendOutcome.REJECTED,
                f"not sent: {what}: no webhook endpoint matches this recipient and "
                "LEDGER_CHANNELS__WEBHOOK_SECRET is not set, so nothing could sign it",
                ErrorClass.INVALID_RECIPIENT,
            )
        body, headers = self.signed_request(delivery, int(self._clock()))
        try:
            answer = await request(
                self._client,
                "POST",
                delivery.recipient,
                deadline_s=self._deadline_s,
                guard=guard,
                content=body,
                headers=headers,
            )
        except (httpx.RequestError, httpx.InvalidURL, SendRefused, DeadlineExceeded) as exc:
            return attempt_failure(exc, what)
        if not 200 <= answer.status <= 299:
            return non_success(answer, what, self._clock)
        # The receiver itself answered 2xx: that is the authoritative acknowledgement.
        receiver_id = string_field(answer.json_object(), "id")
        evidence = f"{what} -> {answer.status}"
        if receiver_id:
            evidence += f", receiver id {receiver_id}"
        if answer.body_error:
            evidence += f" (body read failed: {answer.body_error})"
        return SendResult(
            SendOutcome.CONFIRMED,
            evidence,
            http_status=answer.status,
            provider_message_id=receiver_id,
        )

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """GET ``{lookup_url}/{idempotency_key}``, signed with the endpoint's secrets, if the
        endpoint names a lookup URL; else unsupported."""
        endpoint = self.endpoint_for(delivery.recipient)
        lookup_url = endpoint.lookup_url
        if not lookup_url:
            return LookupResult(
                LookupOutcome.UNSUPPORTED,
                "endpoint has no lookup URL",
            )
        url = f"{lookup_url.rstrip('/')}/{quote(delivery.idempotency_key, safe='')}"
        return await lookup_request(
            self._client,
            url,
            {
                "idempotency-key": delivery.idempotency_key,
                **lookup_headers(endpoint.keys, delivery.idempotency_key, int(self._clock())),
                **({TRACEPARENT: delivery.traceparent} if delivery.traceparent else {}),
            },
            deadline_s=self._deadline_s,
        )


def adapter(build: AdapterBuild) -> WebhookChannel:
    """The webhook channel's adapter factory (its plugin: events/channels/builtin.py)."""
    return WebhookChannel(build.client, build.channels)
