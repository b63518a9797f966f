"""An email recipient's form: one bare address (the email channels' light half).

Both email channels (smtp, email_api) accept the same recipients by this one rule.

A recipient of an email channel is one bare address, ``local@domain``: no display name,
no list, no comment, no whitespace or control character. Anything else could smuggle a
header or a second recipient into the envelope, so it is refused at publish time with a
one-line reason. The rule accepts the common address forms (RFC 5322 dot-atom local part,
a DNS domain of letters, digits and hyphens, or an IPv4/IPv6 literal) and must never get
stricter: it also runs on every read of a ``DeliveryRequested``.
"""

from __future__ import annotations

import ipaddress
import re

# RFC 5322 atext, dot-separated (no quoted local parts: nobody needs them for notifications).
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL = re.compile(rf"{_ATOM}(?:\.{_ATOM})*")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_ADDRESS = 254  # RFC 5321's path limit less the angle brackets
MAX_LOCAL = 64


def _shown(recipient: str) -> str:
    return repr(recipient[:80] + ("..." if len(recipient) > 80 else ""))


def domain_problem(domain: str) -> str | None:
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
    return domain_problem(domain)


def email_refusal(recipient: str) -> str | None:
    """Why a well-formed ``recipient`` must not be mailed (checked where a request is made,
    like a webhook's credentials, never on read), or None: an address literal
    (``user@[127.0.0.1]``) or a ``localhost`` domain makes the relay deliver into its own
    host or network, which no notification needs."""
    domain = recipient.rpartition("@")[2].lower()
    if domain.startswith("["):
        return (
            f"an email recipient may not name an address literal ({domain[:60]}): the relay "
            "would deliver to that host; use the recipient's domain name"
        )
    if domain == "localhost" or domain.endswith(".localhost"):
        return (
            f"an email recipient may not be at {domain[:60]} (the relay's own host); "
            "use the recipient's domain name"
        )
    return None


def check_email_recipient(recipient: str) -> None:
    """An email channel's recipient form: one bare address; ValueError says what is wrong."""
    problem = email_problem(recipient)
    if problem is not None:
        raise ValueError(problem)
