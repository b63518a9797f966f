"""The smtp channel's settings (the light half: no SMTP client here).

Its recipients are one bare address each, by the rule both email channels share
(``events.channels.email_address``, re-exported here).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from events.channels.email_address import check_email_recipient, domain_problem, email_problem

# One rule for both email channels (smtp, email_api): events/channels/email_address.py.
__all__ = [
    "SmtpSettings",
    "TlsMode",
    "check_email_recipient",
    "domain_problem",
    "email_problem",
]


TlsMode = Literal["starttls", "implicit", "none"]
# The origin key signs every message's X-Ledger-Origin; shorter keys are guessable offline
# from one captured message (24 bytes: Standard Webhooks' floor for a shared secret).
MIN_ORIGIN_KEY_BYTES = 24


class SmtpSettings(BaseModel):
    """The smtp channel's entry of ``LEDGER_CHANNELS__SETTINGS`` (README, "The smtp channel").

    Every field has a default so a worker without an smtp entry still starts; a send
    without ``from_address`` is refused with a reason naming this setting.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The relay (submission server).
    host: str = "localhost"
    # None: 465 for implicit TLS, 587 for STARTTLS, 25 without TLS.
    port: int | None = Field(default=None, ge=1, le=65535)
    # starttls: the connection must be upgraded (a relay that does not offer it is refused);
    # implicit: TLS from the first byte (port 465); none: plaintext (loopback, tests).
    tls: TlsMode = "starttls"
    validate_certs: bool = True
    cert_bundle: str | None = None  # a CA bundle file for the relay's certificate
    # SMTP AUTH after (STARTTLS and) EHLO; both or neither.
    username: str | None = None
    password: SecretStr | None = None
    from_address: str | None = None
    # The right-hand side of Message-ID <KEY@DOMAIN>; None: the From address's domain.
    message_id_domain: str | None = None
    # The declaration that the receiver drops a repeated Message-ID: with it, a retry
    # after UNKNOWN re-sends the same Message-ID (dedupe rule "message-id"); without it
    # and without an IMAP lookup, an UNKNOWN stays for an operator.
    receiver_dedupes_message_id: bool = False
    # How long the relay may take to put an accepted message into the archive mailbox.
    settle_s: float | None = Field(default=None, ge=0)
    # The lookup: an archive mailbox (BCC or journal copy of everything the relay accepts),
    # searched by Message-ID over IMAP. No imap_host: no lookup.
    imap_host: str | None = None
    imap_port: int | None = Field(default=None, ge=1, le=65535)  # None: 993 implicit, else 143
    imap_tls: TlsMode = "implicit"
    imap_username: str | None = None
    imap_password: SecretStr | None = None
    imap_mailbox: str = "INBOX"
    # The key of the X-Ledger-Origin header (HMAC-SHA256 of the Message-ID) every message
    # carries when it is set; the lookup takes an archived copy as ours only when that
    # header verifies, so someone else's message with our Message-ID confirms nothing.
    # Required with imap_host. The workers' own secret, not the relay's or the archive's.
    origin_key: SecretStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (SMTP AUTH)")
        if self.from_address is not None and (problem := email_problem(self.from_address)):
            raise ValueError(f"from_address: {problem}")
        domain = self.message_id_domain
        if domain is not None and domain_problem(domain) is not None:
            raise ValueError("message_id_domain must be a host name, e.g. ledger.example.org")
        if self.imap_host is not None and (
            self.imap_username is None or self.imap_password is None
        ):
            raise ValueError("an IMAP lookup needs imap_username and imap_password")
        if self.imap_host is not None and self.origin_key is None:
            raise ValueError(
                "an IMAP lookup needs origin_key, the secret that proves an archived copy is "
                "ours (any random string of 24+ bytes, e.g. `openssl rand -base64 32`)"
            )
        key = self.origin_key
        if key is not None and len(key.get_secret_value().encode()) < MIN_ORIGIN_KEY_BYTES:
            raise ValueError(f"origin_key must be at least {MIN_ORIGIN_KEY_BYTES} bytes")
        if any(ch in self.imap_mailbox for ch in '\r\n"\\'):
            raise ValueError("imap_mailbox may not contain quotes, backslashes or line breaks")
        return self

    @property
    def smtp_port(self) -> int:
        """The port, defaulted by the TLS mode."""
        if self.port is not None:
            return self.port
        return {"implicit": 465, "starttls": 587, "none": 25}[self.tls]

    @property
    def imap_port_used(self) -> int:
        """The IMAP port, defaulted by its TLS mode."""
        if self.imap_port is not None:
            return self.imap_port
        return 993 if self.imap_tls == "implicit" else 143

    @property
    def id_domain(self) -> str | None:
        """The Message-ID domain: the setting, else the From address's domain."""
        if self.message_id_domain is not None:
            return self.message_id_domain
        if self.from_address is None:
            return None
        return self.from_address.rpartition("@")[2]
