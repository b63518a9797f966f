"""The text form of an outcome key: 32 raw Ed25519 bytes, base64.

Checked here with the standard library, so settings can refuse a malformed key without
loading a crypto library; clients/outcome_signing.py builds the keys from these bytes.
"""

from __future__ import annotations

import base64
import binascii


def key_bytes(text: str, what: str) -> bytes:
    """The 32 raw bytes of a base64 Ed25519 key; ValueError says what is wrong (never the key)."""
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"{what} is {len(raw)} bytes, not the 32 of an Ed25519 key")
    return raw


SIGNING_KEY = "the outcome signing key"
VERIFY_KEY = "an outcome verify key"
