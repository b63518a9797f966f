"""Standard Webhooks verification, written apart from the sender's signing code on purpose.

A round trip through one shared implementation would pass with the delimiter, the base64
alphabet or the key decoding all wrong; the receiver side is an independent reading of the
spec (and is itself checked against the spec's published test vector).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: float,
) -> str | None:
    """None if the request is authentic and fresh; else why not (for the 401 and the log)."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not timestamp or not signatures:
        return "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        sent_at = int(timestamp)
    except ValueError:
        return "webhook-timestamp is not an integer"
    if abs(now - sent_at) > tolerance_s:
        return f"webhook-timestamp {sent_at} is outside the {tolerance_s:.0f}s tolerance"
    try:
        key = base64.b64decode(secret.split("_", 1)[1] if secret.startswith("whsec_") else secret)
    except (binascii.Error, ValueError):
        return "receiver secret is not valid base64"
    expected = hmac.new(key, msg_id.encode() + b"." + timestamp.encode() + b"." + body, "sha256")
    wanted = base64.b64encode(expected.digest())
    # The header may carry several space-separated "version,signature" entries.
    for entry in signatures.split(" "):
        version, _, value = entry.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), wanted):
            return None
    return "no v1 signature matches"
