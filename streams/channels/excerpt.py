"""What of a response body may go into evidence: a short, sanitized excerpt.

Evidence is kept forever (``retention.ms=-1``) and shown by ``ledger run``, ``replay`` and
the dashboard, and the body is whatever the target chose to send — an internal service's
error page with its admin token, say. So evidence keeps at most ``EXCERPT_CHARS``
printable characters, with anything that looks like a credential replaced by
``REDACTED``: the value of a secret-looking field (``"token": ...``, ``password=...``,
``Authorization: Bearer ...``) and any long opaque string of letters and digits.
"""

from __future__ import annotations

import re

EXCERPT_CHARS = 80
REDACTED = "REDACTED"

# A field whose name says it holds a secret, then its value (JSON, form, header or prose).
_SECRET_FIELD = re.compile(
    r"""(?ix)
    (?P<name>[\w-]*(?:token|secret|passw(?:or)?d|api[_-]?key|auth\w*|session|cookie|
        credential|signature|private[_-]?key)[\w-]*)
    (?P<sep>["']?\s*[:=]\s*["']?(?:bearer\s+|basic\s+)?)
    (?P<value>[^\s"',;&}]+)
    """
)
# Bearer/Basic credentials anywhere.
_SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[\w.~+/=-]{8,}")
# An opaque string long enough to be a key: 20+ of [A-Za-z0-9_+/=.-] with letters and digits.
_OPAQUE = re.compile(r"[A-Za-z0-9_+/=.~-]{20,}")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")


def excerpt(body: bytes, limit: int = EXCERPT_CHARS) -> str:
    """At most ``limit`` characters of ``body``: printable, one line, credentials redacted."""
    # Redact before cutting, so a secret that straddles the cut is not half kept.
    text = body[: limit * 8].decode("utf-8", errors="replace")
    text = " ".join(_UNPRINTABLE.sub(" ", text).split())
    text = _SECRET_FIELD.sub(lambda m: f"{m['name']}{m['sep']}{REDACTED}", text)
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m[1]} {REDACTED}", text)
    text = _OPAQUE.sub(_opaque, text)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def _opaque(match: re.Match[str]) -> str:
    word = match[0]
    if word == REDACTED or not (re.search(r"\d", word) and re.search(r"[A-Za-z]", word)):
        return word  # a long word or number, not a key
    return REDACTED
