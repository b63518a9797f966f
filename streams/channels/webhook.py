"""The webhook channel: a Standard Webhooks POST, signed, carrying the idempotency key.

Headers: ``webhook-id`` (the idempotency key), ``webhook-timestamp`` (unix seconds, fresh
per attempt), ``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 over ``id.timestamp.body``)
and ``Idempotency-Key``. The body is the delivery's payload as canonical JSON, so every
attempt of one logical event carries the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from events.keys import canonical_json
from events.settings import Settings
from streams.channels.base import (
    FENCING_TOKEN_HEADER,
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
from streams.channels.signature import secret_key, sign
from streams.channels.write_guard import SendRefused, WriteGuard


@dataclass(frozen=True)
class ResolvedEndpoint:
    """What applies to one recipient URL: the HMAC key and the optional lookup URL."""

    prefix: str | None  # the settings.webhook_endpoints entry that matched, if any
    key: bytes = b""
    lookup_url: str | None = None
    receiver_dedupes: bool = False
    settle_s: float | None = None


class WebhookChannel:
    """Standard Webhooks sender. Receivers are asked to dedupe on ``webhook-id``, but only
    an endpoint that declares it (``receiver_dedupes``) is trusted to."""

    name = "webhook"

    def __init__(
        self,
        client: httpx.AsyncClient,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._clock = clock
        self._deadline_s = settings.send_deadline_s
        self._default = ResolvedEndpoint(
            None, secret_key(settings.webhook_secret.get_secret_value())
        )
        endpoints = []
        for prefix, endpoint in settings.webhook_endpoints.items():
            try:
                key = (
                    secret_key(endpoint.secret.get_secret_value())
                    if endpoint.secret is not None
                    else self._default.key
                )
            except ValueError as exc:
                raise ValueError(f"webhook endpoint {prefix!r}: {exc}") from None
            endpoints.append(
                ResolvedEndpoint(
                    prefix, key, endpoint.lookup_url, endpoint.receiver_dedupes, endpoint.settle_s
                )
            )
        # Longest prefix first, so the most specific configuration wins.
        self._endpoints = sorted(endpoints, key=lambda e: len(e.prefix or ""), reverse=True)

    def endpoint_for(self, recipient: str) -> ResolvedEndpoint:
        """The configuration for ``recipient``: longest matching prefix, else the defaults."""
        for endpoint in self._endpoints:
            if endpoint.prefix is not None and recipient.startswith(endpoint.prefix):
                return endpoint
        return self._default

    def receiver_dedupes(self, recipient: str) -> bool:
        """Only what the endpoint's configuration declares."""
        return self.endpoint_for(recipient).receiver_dedupes

    def settle_s(self, recipient: str) -> float | None:
        """The endpoint's settle window, if it names one."""
        return self.endpoint_for(recipient).settle_s

    def signed_request(
        self, delivery: OutboundDelivery, timestamp: int
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one attempt, signed with the endpoint's secret."""
        body = canonical_json(delivery.payload)
        key = self.endpoint_for(delivery.recipient).key
        headers = {
            "content-type": "application/json",
            "webhook-id": delivery.idempotency_key,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, delivery.idempotency_key, timestamp, body),
            "idempotency-key": delivery.idempotency_key,
            FENCING_TOKEN_HEADER: str(delivery.fencing_token),
        }
        return body, headers

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """POST one signed attempt and classify what happened (never raises for delivery)."""
        what = f"POST {delivery.recipient}"
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
        """GET ``{lookup_url}/{idempotency_key}`` if the endpoint names one; else unsupported."""
        lookup_url = self.endpoint_for(delivery.recipient).lookup_url
        if not lookup_url:
            return LookupResult(
                "unsupported",
                "endpoint has no lookup URL",
            )
        url = f"{lookup_url.rstrip('/')}/{quote(delivery.idempotency_key, safe='')}"
        return await lookup_request(
            self._client,
            url,
            {"idempotency-key": delivery.idempotency_key},
            deadline_s=self._deadline_s,
        )
