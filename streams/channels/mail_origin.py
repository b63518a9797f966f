"""The proof that an email in the archive is one the ledger sent: an HMAC of its Message-ID.

A Message-ID is no secret (``<KEY@DOMAIN>``, the key derived from public parts), and anyone
who can mail the relay, or append to the archive, can file a message carrying it. So every
message the smtp channel sends carries ``X-Ledger-Origin: v1=HEX``, HMAC-SHA256 under the
smtp channel's ``origin_key`` of the exact Message-ID, and the IMAP lookup takes a copy as
ours only when that header verifies. The key is the workers' own secret: not the relay's
password or the archive's (whoever can read the archive over IMAP can also APPEND to it).
"""

from __future__ import annotations

import hashlib
import hmac

from pydantic import SecretStr

ORIGIN_HEADER = "X-Ledger-Origin"
_VERSION = "v1"
# Domain separation: this key signs nothing else, but a future use must not collide.
_CONTEXT = b"delivery-ledger smtp origin v1\x00"


def origin_seal(key: SecretStr, message_id: str) -> str:
    """The ``X-Ledger-Origin`` value of the message with ``message_id`` (angle brackets
    included)."""
    mac = hmac.new(key.get_secret_value().encode(), _CONTEXT + message_id.encode(), hashlib.sha256)
    return f"{_VERSION}={mac.hexdigest()}"


def sealed_by_us(key: SecretStr, message_id: str, seals: list[str]) -> bool:
    """Does one of a message's ``X-Ledger-Origin`` values verify for ``message_id``?"""
    expected = origin_seal(key, message_id).encode()
    return any(hmac.compare_digest(expected, seal.strip().encode()) for seal in seals)
