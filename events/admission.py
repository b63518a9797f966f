"""Whether a well-formed delivery request may be sent at all: one rule for every writer.

The SDK refuses such a request before anything is written; anyone with write access to
the topic can still append one, so the worker applies the same rule right before a send
and fails the delivery with the reason (``ErrorClass.REFUSED_REQUEST``): it shows as
FAILED, with why, in every view, instead of PENDING forever or silently dropped.
"""

from __future__ import annotations

from pydantic import JsonValue

from events.channels import recipient_refusal
from events.keys import canonical_json


def payload_too_large(payload: JsonValue, max_payload_bytes: int) -> str | None:
    """Why ``payload`` is over the limit (its canonical JSON size), or None."""
    size = len(canonical_json(payload))
    if size <= max_payload_bytes:
        return None
    return (
        f"payload is {size} bytes, over the limit of {max_payload_bytes} "
        "(LEDGER_PUBLISHER__MAX_PAYLOAD_BYTES)"
    )


def refusal(channel: str, recipient: str, payload: JsonValue, max_payload_bytes: int) -> str | None:
    """Why this request must not be sent (the channel refuses the recipient, e.g. an URL
    carrying credentials; an oversized payload), or None. The reason never repeats a secret."""
    return recipient_refusal(channel, recipient) or payload_too_large(payload, max_payload_bytes)
