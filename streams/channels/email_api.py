"""The email_api channel: an email sent through an HTTP email API, shaped like the common
providers (Resend, Postmark, SendGrid-like).

``POST {api}/emails`` with a JSON message (``from``, ``to``, ``subject``, ``text``/``html``,
``headers``), ``Authorization: Bearer <api key>`` and ``Idempotency-Key``. An answer with a
message id is SENT: the provider accepted it, nobody has read it yet. The status comes by
lookup: a SENT is polled with ``GET {api}/emails/{id}``; an UNKNOWN (a timeout or a 5xx
after the request was written) with ``GET {api}/emails?idempotency_key=K`` where the API
offers it (``lookup_by_key``). ``delivered`` is CONFIRMED; ``bounced``/``failed``/
``complained`` is FAILED with the provider's reason; ``queued``/``sent`` stay SENT.
Errors: 429 (+ ``Retry-After``) was not processed and is retried after the delay; 401, 403,
422 (any other 4xx) are permanent; a 5xx or a timeout is UNKNOWN and goes to lookup.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from urllib.parse import quote

import httpx
from pydantic import JsonValue

from events.channels.email_api import EmailApiSettings
from events.keys import canonical_json
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.base import (
    FENCING_TOKEN_HEADER,
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.excerpt import excerpt
from streams.channels.outcomes import (
    Answer,
    DeadlineExceeded,
    attempt_failure,
    lookup_request,
    non_success,
    request,
    string_field,
)
from streams.channels.write_guard import SendRefused, WriteGuard

DELIVERED = "delivered"
# The provider's final word that the message did not reach the mailbox (or was reported).
FAILED_STATUSES = frozenset({"bounced", "failed", "complained"})
# The email's own header, so the recipient's mail (and an archive) carries the key too.
KEY_HEADER = "X-Ledger-Idempotency-Key"
NOT_CONFIGURED = (
    "the email_api channel is not configured: set api_url, api_key and from_address in "
    "LEDGER_CHANNELS__SETTINGS[email_api]"
)


def is_delivered(status: str | None) -> bool:
    """Only the provider's ``delivered`` is authoritative."""
    return status == DELIVERED


def is_failed(status: str | None) -> bool:
    """A bounce, a failure or a complaint: the message did not land (or was refused)."""
    return status in FAILED_STATUSES


def email_message(delivery: OutboundDelivery, sender: str) -> dict[str, JsonValue]:
    """The JSON message of one attempt.

    A payload object gives ``subject``, ``text`` and ``html``; without a subject the
    delivery's event type is the subject, and a payload with neither text nor html is sent
    as ``text``: a string as it is, anything else as canonical JSON.
    """
    payload = delivery.payload
    fields = payload if isinstance(payload, dict) else {}
    subject = fields.get("subject")
    message: dict[str, JsonValue] = {
        "from": sender,
        "to": [delivery.recipient],
        "subject": subject if isinstance(subject, str) and subject else delivery.event_type,
    }
    for name in ("text", "html"):
        value = fields.get(name)
        if isinstance(value, str) and value:
            message[name] = value
    if "text" not in message and "html" not in message:
        text = payload if isinstance(payload, str) else canonical_json(payload).decode()
        message["text"] = text
    # Nothing that changes per attempt (fencing token, attempt number) goes into the
    # message: providers compare a repeated Idempotency-Key's body and refuse a different
    # one (409), so every attempt of a key must send the same bytes. The token travels in
    # the request's ``fencing-token`` header.
    message["headers"] = {KEY_HEADER: delivery.idempotency_key}
    return message


class EmailApiChannel:
    """An HTTP email API client: SENT on the message id, CONFIRMED by a lookup's delivered."""

    name = "email_api"

    def __init__(
        self,
        client: httpx.AsyncClient,
        config: EmailApiSettings,
        *,
        deadline_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._config = config
        self._deadline_s = deadline_s
        self._clock = clock

    def receiver_dedupes(self, recipient: str) -> bool:
        """What the operator declared (``provider_dedupes``): the provider drops a repeated
        Idempotency-Key for 24 h. The decisions apply the rule only when no lookup can
        settle an UNKNOWN, and only within that window from the request."""
        del recipient
        return self._config.provider_dedupes

    def settle_s(self, recipient: str) -> float | None:
        """The default settle window applies."""
        del recipient
        return None

    def _auth(self) -> dict[str, str]:
        key = self._config.api_key
        return {"authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """POST one attempt to ``{api}/emails`` with ``Idempotency-Key``; classify the answer."""
        config = self._config
        if config.api_url is None or config.from_address is None:
            return SendResult(
                SendOutcome.REJECTED, f"not sent: {NOT_CONFIGURED}", ErrorClass.INVALID_RECIPIENT
            )
        url = f"{config.api_url}/emails"
        what = f"POST {url} (to {delivery.recipient})"
        headers = {
            "content-type": "application/json",
            "idempotency-key": delivery.idempotency_key,
            FENCING_TOKEN_HEADER: str(delivery.fencing_token),
            **self._auth(),
        }
        try:
            answer = await request(
                self._client,
                "POST",
                url,
                deadline_s=self._deadline_s,
                guard=guard,
                content=canonical_json(email_message(delivery, config.from_address)),
                headers=headers,
            )
        except (httpx.RequestError, httpx.InvalidURL, SendRefused, DeadlineExceeded) as exc:
            return attempt_failure(exc, what)
        if not 200 <= answer.status <= 299:
            # 429: not processed, retried after Retry-After; 401/403/422: permanent; 5xx: it
            # may have been accepted first, so UNKNOWN and the lookup decides.
            return _with_provider_error(non_success(answer, what, self._clock), answer, what)
        body = answer.json_object()
        message_id = string_field(body, "id")
        status = string_field(body, "status") or "queued"
        evidence = f"{what} -> {answer.status}, id {message_id}"
        if message_id is None:
            # Accepted, but we cannot read its id: SENT, and the lookup by key settles it.
            return SendResult(
                SendOutcome.SENT,
                f"{evidence}; unreadable answer: {answer.excerpt()}"[:1000],
                ErrorClass.PROTOCOL_ERROR,
                answer.status,
                None,
                status,
            )
        return SendResult(SendOutcome.SENT, evidence, None, answer.status, message_id, status)

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """By the message id when an answer gave one, else by key where the API offers it."""
        config = self._config
        if config.api_url is None:
            return LookupResult(LookupOutcome.LOOKUP_ERROR, NOT_CONFIGURED)
        params: dict[str, str] | None = None
        if delivery.provider_message_id is not None:
            url = f"{config.api_url}/emails/{quote(delivery.provider_message_id, safe='')}"
        elif config.lookup_by_key:
            url = f"{config.api_url}/emails"
            params = {"idempotency_key": delivery.idempotency_key}
        else:
            return LookupResult(
                LookupOutcome.UNSUPPORTED,
                "no message id and no lookup by idempotency key "
                "(LEDGER_CHANNELS__SETTINGS[email_api].lookup_by_key=false)",
            )
        return await lookup_request(
            self._client,
            url,
            self._auth(),
            params,
            deadline_s=self._deadline_s,
            delivered=is_delivered,
            failed=is_failed,
            reason_field="reason",
        )


def _with_provider_error(result: SendResult, answer: Answer, what: str) -> SendResult:
    """The provider's own ``name: message`` as the evidence, where its error body has one:
    it says why (a suppressed address, a bad sender), which the body's start may not."""
    body = answer.json_object()
    message = string_field(body, "message")
    if message is None:
        return result
    name = string_field(body, "name") or "error"
    said = excerpt(f"{name}: {message}".encode(), 240)
    return dataclasses.replace(result, evidence=f"{what} -> {answer.status} {said}"[:1000])


def adapter(build: AdapterBuild) -> EmailApiChannel:
    """The email_api channel's adapter factory (its plugin: events/channels/builtin.py)."""
    config = build.config
    if not isinstance(config, EmailApiSettings):
        config = EmailApiSettings()
    return EmailApiChannel(build.client, config, deadline_s=build.deadline_s)
