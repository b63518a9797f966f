"""The idempotency key, and the compact sorted-key JSON of request bodies.

Payload hashes are in events/payload_hashes.py (RFC 8785); ``canonical_json`` is the form
the unprefixed (legacy) payload hashes were taken over, and the body the HTTP channels send.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def idempotency_key(run_id: str, event_type: str, channel: str, recipient: str) -> str:
    """sha256 of ``run_id:event_type:channel:recipient``, hex: one key per logical event.

    Derived from the logical event, never from the attempt, so a retry after a timeout
    addresses the same key at the receiver.
    """
    material = f"{run_id}:{event_type}:{channel}:{recipient}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys, no insignificant whitespace, UTF-8: one byte string per value.

    Not RFC 8785: Python's float spelling and code-point key order. Kept byte for byte:
    the legacy payload hashes are over it, and receivers verify signatures over bodies."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")
