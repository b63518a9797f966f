"""What the ledger's worker and a receiver agree on beyond Standard Webhooks: the fencing
token, the authenticated lookup (its headers, its statuses, the shape of its answer), the
size of a secret. Defined once, here (standard library only, importable without the
ledger's Kafka clients): the kit checks it, the worker's channels and the simulator sign
and read it.

Both extra signatures are HMAC-SHA256 under a key derived from the endpoint's Standard
Webhooks secret, one key per purpose::

    purpose_key = HMAC-SHA256(secret_bytes, "delivery-ledger/" + purpose)
    fencing-token-signature: v1,base64(HMAC-SHA256(purpose_key("fencing-token"),
                                                   "<webhook-id>.<webhook-timestamp>.<token>"))
    lookup-signature:        v1,base64(HMAC-SHA256(purpose_key("lookup"),
                                                   "<key>.<lookup-timestamp>"))

A key whose handler died mid-run is settled by the receiver's declared rule (the receiver
kit: ``WebhookReceiver(idempotent_handler=...)``, docs/LOOKUP_CONTRACT.md): an idempotent
handler's key answers ``failed`` and the next request runs it again; any other answers
``stuck`` and is left for an operator, because running it again could do its work twice.

A derived key (rather than the secret itself) means no signature of one kind is ever a
valid signature of another: a captured lookup or token signature cannot pass as a webhook
signature, whatever the key, timestamp or body. As with ``webhook-signature``, the header
holds one space-separated ``v1,`` entry per active secret during a rotation.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import NotRequired, TypedDict

# The attempt's fencing token (it grows per key) and its signature.
FENCING_TOKEN_HEADER = "fencing-token"  # noqa: S105 - a header name
FENCING_TOKEN_SIGNATURE_HEADER = "fencing-token-signature"  # noqa: S105 - a header name
# A lookup's freshness (unix seconds) and signature.
LOOKUP_TIMESTAMP_HEADER = "lookup-timestamp"
LOOKUP_SIGNATURE_HEADER = "lookup-signature"


class LookupStatus(StrEnum):
    """The ``status`` of a lookup's answer (``GET <lookup url>?key=<webhook-id>``)."""

    DONE = "done"  # 200: the handler ran; ``id`` is the receiver's record of it
    PROCESSING = "processing"  # 202: received, the handler is still running
    NOT_FOUND = "not_found"  # 404: never received
    # 404: received but the handler failed, or its run died and the receiver declared the
    # handler idempotent: a retry is safe and runs it again.
    FAILED = "failed"
    # 409: received, and the run of the handler died mid-processing (its lease ran out with
    # no outcome); the handler is not declared idempotent, so it is never run again for the
    # key. Whether it did its work is unknown: only an operator can settle it (the ledger
    # keeps the delivery UNKNOWN, ``receiver_stuck``, and stops looking it up).
    STUCK = "stuck"


# The HTTP status each lookup status is answered with. ``stuck`` is an error status, so a
# client that predates it reads neither success nor "not found" (a retry) into it.
LOOKUP_HTTP_STATUS = {
    LookupStatus.DONE: 200,
    LookupStatus.PROCESSING: 202,
    LookupStatus.NOT_FOUND: 404,
    LookupStatus.FAILED: 404,
    LookupStatus.STUCK: 409,
}


class LookupAnswer(TypedDict):
    """The JSON body of a lookup's answer."""

    status: str  # a LookupStatus value
    webhook_id: str  # the key asked about
    id: NotRequired[str | None]  # with ``done``: the receiver's id for the delivery


def lookup_answer(status: LookupStatus, key: str, result_id: str | None = None) -> LookupAnswer:
    """The body a receiver answers a lookup of ``key`` with (``result_id`` with ``done``)."""
    answer = LookupAnswer(status=status.value, webhook_id=key)
    if status is LookupStatus.DONE:
        answer["id"] = result_id
    return answer


# Standard Webhooks recommends secrets of 24 to 64 random bytes; a shorter one can be
# recovered from a captured request.
MIN_SECRET_BYTES = 24
MAX_FENCING_TOKEN = 2**63 - 1  # a signed 64-bit integer, as the stores keep it
_MAX_TOKEN_DIGITS = len(str(MAX_FENCING_TOKEN))
_SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret


def secret_key(secret: str) -> bytes:
    """The key bytes of a ``whsec_`` secret, read as ``standardwebhooks`` reads it.

    ValueError (one line, never the secret) if it is empty, not base64 or too short.
    """
    encoded = secret.removeprefix(_SECRET_PREFIX)
    try:
        # Exactly as the library decodes it: padding optional (surplus padding is ignored).
        key = base64.b64decode(encoded + "==")
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret is not 'whsec_' followed by base64") from None
    if not key:
        raise ValueError("webhook secret is empty")
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"webhook secret is {len(key)} bytes; at least {MIN_SECRET_BYTES} are required "
            "(Standard Webhooks recommends 24 to 64 random bytes)"
        )
    return key


def parse_fencing_token(raw: str) -> int:
    """A fencing-token header as an integer in 0..2^63-1; ValueError says why not."""
    text = raw.strip()
    # str.isdigit() accepts "²" and other digits int() refuses; only ASCII 0-9 here.
    if not text or len(text) > _MAX_TOKEN_DIGITS or not text.isascii() or not text.isdigit():
        raise ValueError(
            f"{FENCING_TOKEN_HEADER} must be a non-negative integer of at most "
            f"{_MAX_TOKEN_DIGITS} digits"
        )
    token = int(text)
    if token > MAX_FENCING_TOKEN:
        raise ValueError(f"{FENCING_TOKEN_HEADER} must be at most 2^63-1")
    return token


def _purpose_key(key: bytes, purpose: str) -> bytes:
    return hmac.new(key, f"delivery-ledger/{purpose}".encode(), hashlib.sha256).digest()


def _sign(keys: Iterable[bytes], purpose: str, message: str) -> str:
    entries = []
    for key in keys:
        mac = hmac.new(_purpose_key(key, purpose), message.encode(), hashlib.sha256).digest()
        entries.append("v1," + base64.b64encode(mac).decode())
    if not entries:
        raise ValueError("no webhook secret to sign with")
    return " ".join(entries)


def _matches(keys: Iterable[bytes], purpose: str, message: str, header: str) -> bool:
    """True if any ``v1,`` entry of ``header`` is the signature of ``message`` by any key."""
    offered = [
        signature
        for version, _, signature in (entry.partition(",") for entry in header.split(" "))
        if version == "v1" and signature
    ]
    for expected in _sign(keys, purpose, message).split(" "):
        mac = expected.removeprefix("v1,")
        if any(hmac.compare_digest(mac.encode(), each.encode()) for each in offered):
            return True
    return False


def _token_message(webhook_id: str, timestamp: str, token: int) -> str:
    return f"{webhook_id}.{timestamp}.{token}"


def _lookup_message(key: str, timestamp: str) -> str:
    return f"{key}.{timestamp}"


def fencing_token_signature(
    keys: Iterable[bytes], webhook_id: str, timestamp: int, token: int
) -> str:
    """The ``fencing-token-signature`` value for one attempt, one entry per key."""
    return _sign(keys, "fencing-token", _token_message(webhook_id, str(timestamp), token))


def fencing_token_verified(keys: Iterable[bytes], headers: Mapping[str, str], token: int) -> bool:
    """True if the request's token signature binds ``token`` to its webhook-id and timestamp."""
    signature = headers.get(FENCING_TOKEN_SIGNATURE_HEADER, "")
    message = _token_message(
        headers.get("webhook-id", ""), headers.get("webhook-timestamp", ""), token
    )
    return bool(signature) and _matches(keys, "fencing-token", message, signature)


def lookup_headers(keys: Iterable[bytes], key: str, timestamp: int) -> dict[str, str]:
    """The headers that authenticate a lookup of ``key`` at ``timestamp``."""
    return {
        LOOKUP_TIMESTAMP_HEADER: str(timestamp),
        LOOKUP_SIGNATURE_HEADER: _sign(keys, "lookup", _lookup_message(key, str(timestamp))),
    }


def lookup_problem(
    keys: Iterable[bytes],
    headers: Mapping[str, str],
    key: str,
    *,
    now: float,
    tolerance_s: float,
) -> str | None:
    """None if the lookup of ``key`` is signed by one of ``keys`` and fresh; else why not."""
    timestamp = headers.get(LOOKUP_TIMESTAMP_HEADER)
    signature = headers.get(LOOKUP_SIGNATURE_HEADER)
    if not timestamp or not signature:
        return f"missing {LOOKUP_TIMESTAMP_HEADER} or {LOOKUP_SIGNATURE_HEADER} header"
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        return f"{LOOKUP_TIMESTAMP_HEADER} is not unix seconds"
    if abs(now - int(timestamp)) > tolerance_s:
        return (
            f"{LOOKUP_TIMESTAMP_HEADER} {timestamp} is {abs(now - int(timestamp)):.0f}s away "
            f"from now, outside the {tolerance_s:.0f}s tolerance (check the sender's clock)"
        )
    if not _matches(keys, "lookup", _lookup_message(key, timestamp), signature):
        return "no v1 lookup signature matches any of the receiver's secrets"
    return None
