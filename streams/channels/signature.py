"""Standard Webhooks signing through the official library (``standardwebhooks``).

The library parses secrets exactly as receivers that use it do (``whsec_`` prefix
optional, padding optional), so a secret a receiver accepts is one we can sign with.
This module only adapts it: secrets refused with a line that never repeats them (and
shorter than the 24 bytes Standard Webhooks recommends), and one ``v1,`` signature per
active secret in one header (a rotation sends both).
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from events.contract import secret_key


def signer(secret: SecretStr) -> Webhook:
    """The library's signer for ``secret``; ValueError (never naming the secret) if refused,
    by the library or for being shorter than 24 bytes."""
    try:
        webhook = Webhook(secret.get_secret_value())
    except EmptyWebhookSecretError:
        raise ValueError("webhook secret is empty") from None
    except (binascii.Error, ValueError, RuntimeError):
        # Never echo the secret itself: it would end up in logs.
        raise ValueError("webhook secret is not 'whsec_' followed by base64") from None
    signing_key(secret)
    return webhook


def signing_key(secret: SecretStr) -> bytes:
    """The key bytes of ``secret`` (for the fencing-token and lookup signatures of the
    receiver contract, ``events/contract.py``); ValueError if too short."""
    return secret_key(secret.get_secret_value())


def signature_header(signers: Sequence[Webhook], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64 HMAC-SHA256>`` per signer, space separated."""
    if not signers:
        raise ValueError("no webhook secret to sign with")
    at = datetime.fromtimestamp(timestamp, tz=UTC)
    data = body.decode("utf-8")  # the library signs text; canonical JSON is UTF-8
    return " ".join(each.sign(msg_id, at, data) for each in signers)
