"""Standard Webhooks signatures: ``v1,`` + base64 HMAC-SHA256 over ``id.timestamp.body``."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret: the base64-decoded part (as the spec says)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        # Never echo the secret itself: it would end up in logs.
        raise ValueError("webhook secret is not 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("webhook secret is empty")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one message: ``v1,<base64 HMAC-SHA256>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")
