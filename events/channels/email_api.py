"""The email_api channel's settings and dedupe rule (the light half: no HTTP client here).

An HTTP email API shaped like the common providers (Resend, Postmark, SendGrid-like):
``POST {api_url}/emails`` with ``Authorization: Bearer`` and ``Idempotency-Key``, a message
id in the answer, the delivery status by ``GET {api_url}/emails/{id}``. README, "The
email_api channel".
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

from events.channels.email_address import email_problem
from events.channels.plugin import DedupeRule
from events.channels.urls import check_http_url

# Providers of this shape keep an Idempotency-Key for about 24 hours (Resend documents 24 h,
# as Stripe-style APIs do): a repeat within it returns the first answer and sends nothing.
# Past it the key is forgotten, so the rule is never relied on there (decisions.remembered).
IDEMPOTENCY_WINDOW_S = 24 * 60 * 60

IDEMPOTENCY_KEY_DEDUPE = DedupeRule(
    name="idempotency-key-24h",
    description=(
        "the email API drops a repeated Idempotency-Key for 24 h from the request "
        "(LEDGER_CHANNELS__SETTINGS[email_api].provider_dedupes=true)"
    ),
    window_s=IDEMPOTENCY_WINDOW_S,
)


class EmailApiSettings(BaseModel):
    """The email_api channel's entry of ``LEDGER_CHANNELS__SETTINGS``.

    Every field has a default so a worker without an entry still starts; a send without
    ``api_url``/``api_key``/``from_address`` is refused (FAILED, nothing sent) with a reason
    naming this setting.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The API base, e.g. https://api.example-mail.com (``/emails`` is appended).
    api_url: str | None = None
    api_key: SecretStr | None = None
    # The sender address every message goes from (one bare address).
    from_address: str | None = None
    # This API shape's contract: ``GET {api_url}/emails?idempotency_key=K`` finds the message
    # a request with that key made, which settles an UNKNOWN. A provider that lists and gets
    # by id only (Resend) has no such lookup: set false, and an UNKNOWN with no message id
    # stays for an operator unless ``provider_dedupes`` allows a retry.
    lookup_by_key: bool = True
    # Declares that the provider drops a repeated Idempotency-Key for 24 h: with no lookup
    # evidence, a retry after UNKNOWN is then allowed within 24 h of the request
    # (dedupe rule ``idempotency-key-24h``). Never a default: a provider that ignores the
    # header would send twice.
    provider_dedupes: bool = False

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_http_url(value)
        return value.rstrip("/")

    @field_validator("from_address")
    @classmethod
    def _from_address(cls, value: str | None) -> str | None:
        problem = email_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _together(self) -> Self:
        given = [self.api_url is not None, self.api_key is not None, self.from_address is not None]
        if any(given) and not all(given):
            raise ValueError("api_url, api_key and from_address go together: give all three")
        return self

    @property
    def configured(self) -> bool:
        """True when the channel can send."""
        return self.api_url is not None
