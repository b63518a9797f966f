"""Standard Webhooks verification by the official library, as a receiver would do it.

The receiver uses ``standardwebhooks`` itself (``Webhook(secret).verify``), the library a
customer's receiver most likely runs: a sender whose secret parsing or signing differs
from it shows here as a 401. The library is checked against the spec's published test
vector (tests/streams/channels/test_signature.py). Freshness is checked first with the
simulator's own tolerance, so a test can narrow it (the library's window is 5 minutes).
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping

from standardwebhooks import Webhook, WebhookVerificationError
from standardwebhooks.webhooks import EmptyWebhookSecretError

from events.contract import lookup_problem, secret_key
from receiver.verification import signature_header_problem

LIBRARY_TOLERANCE_S = 300.0  # standardwebhooks accepts timestamps within 5 minutes


def verify_signature(
    secret: str | None,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance_s: float,
) -> str | None:
    """None if the request is authentic and fresh; else why not (for the 401 and the log)."""
    if secret is None:
        return "the receiver has no webhook secret configured"
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
        webhook = Webhook(secret)
    except (binascii.Error, ValueError, EmptyWebhookSecretError):
        return "receiver secret is not valid base64"
    wanted = {"webhook-id": msg_id, "webhook-timestamp": timestamp, "webhook-signature": signatures}
    try:
        webhook.verify(body, wanted, json_parse=False)
    except WebhookVerificationError as exc:
        if "signature" in str(exc).lower():
            return signature_header_problem(signatures) or "no v1 signature matches"
        return f"rejected by standardwebhooks: {exc}"
    except ValueError:  # an entry without "," or with bad base64, a body that is not UTF-8
        return "webhook-signature or body is malformed"
    return None


def verify_lookup(
    secrets: list[str],
    headers: Mapping[str, str],
    key: str,
    *,
    now: float,
    tolerance_s: float,
) -> str | None:
    """None if a lookup of ``key`` is signed with any of ``secrets`` (the receiver contract,
    as the kit checks it) and fresh; else why not."""
    if not secrets:
        return "the receiver has no webhook secret configured"
    keys = [secret_key(secret) for secret in secrets]
    return lookup_problem(keys, headers, key, now=now, tolerance_s=tolerance_s)
