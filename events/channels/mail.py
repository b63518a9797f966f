"""Email recipients and the smtp channel's settings (the light half: no SMTP client here).

A recipient of the ``smtp`` channel is one bare address, ``local@domain``: no display name,
no list, no comment, no whitespace or control character. Anything else could smuggle a
header or a second recipient into the envelope, so it is refused at publish time with a
one-line reason. The rule accepts the common address forms (RFC 5322 dot-atom local part,
a DNS domain of letters, digits and hyphens, or an IPv4/IPv6 literal) and must never get
stricter: it also runs on every read of a ``DeliveryRequested``.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

# RFC 5322 atext, dot-separated (no quoted local parts: nobody needs them for notifications).
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL = re.compile(rf"{_ATOM}(?:\.{_ATOM})*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_ADDRESS = 254  # RFC 5321's path limit less the angle brackets
MAX_LOCAL = 64


def _shown(recipient: str) -> str:
    return repr(recipient[:80] + ("..." if len(recipient) > 80 else ""))


def _domain_problem(domain: str) -> str | None:
    if domain.startswith("[") and domain.endswith("]"):
        literal = domain[1:-1]
        literal = literal.removeprefix("IPv6:")
        try:
            ipaddress.ip_address(literal)
        except ValueError:
            return f"the address literal {domain!r} is not an IP address"
        return None
    labels = domain.split(".")
    if len(domain) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return (
            f"the domain {domain[:80]!r} is not a host name (labels of letters, digits and "
            "'-', separated by '.')"
        )
    return None


def email_problem(recipient: str) -> str | None:
    """Why ``recipient`` is not one bare email address, in one line; None if it is one."""
    if any(ch in recipient for ch in "\r\n\x00"):
        return f"an email recipient may not contain a line break or NUL: {_shown(recipient)}"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in recipient):
        return f"an email recipient may not contain control characters: {_shown(recipient)}"
    if any(ch in recipient for ch in '<>"(),;:') or any(ch.isspace() for ch in recipient):
        return (
            "an email recipient is one bare address like name@example.org: no display name, "
            f"quotes, comments, lists or spaces, got {_shown(recipient)}"
        )
    if len(recipient) > MAX_ADDRESS:
        return f"an email address is at most {MAX_ADDRESS} characters, got {len(recipient)}"
    local, at, domain = recipient.rpartition("@")
    if not at or not local or not domain:
        return f"an email recipient must look like name@example.org, got {_shown(recipient)}"
    if len(local) > MAX_LOCAL or not _LOCAL.fullmatch(local):
        return (
            f"the local part {local[:80]!r} is not a dot-atom of at most {MAX_LOCAL} "
            "characters (letters, digits, !#$%&'*+/=?^_`{|}~- separated by single dots)"
        )
    return _domain_problem(domain)


def check_email_recipient(recipient: str) -> None:
    """The smtp channel's recipient form: one bare address; ValueError says what is wrong."""
    problem = email_problem(recipient)
    if problem is not None:
        raise ValueError(problem)


TlsMode = Literal["starttls", "implicit", "none"]


class SmtpSettings(BaseModel):
    """The smtp channel's entry of ``LEDGER_CHANNEL_SETTINGS`` (README, "The smtp channel").

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

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (SMTP AUTH)")
        if self.from_address is not None and (problem := email_problem(self.from_address)):
            raise ValueError(f"from_address: {problem}")
        domain = self.message_id_domain
        if domain is not None and _domain_problem(domain) is not None:
            raise ValueError("message_id_domain must be a host name, e.g. ledger.example.org")
        if self.imap_host is not None and (
            self.imap_username is None or self.imap_password is None
        ):
            raise ValueError("an IMAP lookup needs imap_username and imap_password")
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
