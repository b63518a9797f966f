"""Standard Webhooks verification by the official ``standardwebhooks`` library.

Several secrets are accepted at once, for rotation: the sender puts one ``v1,`` signature
per secret it holds into ``webhook-signature``, and a request is authentic when any of
them matches any of ours. Freshness is checked here first, so the tolerance can be
narrower than the library's own five minutes.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence

from standardwebhooks import Webhook, WebhookVerificationError
from standardwebhooks.webhooks import EmptyWebhookSecretError

from events.contract import fencing_token_verified, lookup_problem, secret_key

LIBRARY_TOLERANCE_S = 300.0  # the library refuses timestamps more than 5 minutes away


class SignatureVerifier:
    """Checks ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` on a request."""

    def __init__(self, secrets: Sequence[str], *, tolerance_s: float = LIBRARY_TOLERANCE_S):
        if not secrets:
            raise ValueError("the receiver needs at least one webhook secret (whsec_...)")
        if not 0 < tolerance_s <= LIBRARY_TOLERANCE_S:
            raise ValueError(f"tolerance_s must be above 0 and at most {LIBRARY_TOLERANCE_S:.0f}")
        self._webhooks = [_webhook(secret, n) for n, secret in enumerate(secrets, 1)]
        self._keys = [_key(secret, n) for n, secret in enumerate(secrets, 1)]
        self.tolerance_s = tolerance_s

    def problem(self, headers: Mapping[str, str], body: bytes, *, now: float) -> str | None:
        """None if the request is authentic and fresh; else why not (one line, no secret)."""
        msg_id = headers.get("webhook-id")
        timestamp = headers.get("webhook-timestamp")
        signatures = headers.get("webhook-signature")
        if not msg_id or not timestamp or not signatures:
            return "missing webhook-id, webhook-timestamp or webhook-signature header"
        try:
            sent_at = int(timestamp)
        except ValueError:
            return "webhook-timestamp is not an integer (unix seconds)"
        if abs(now - sent_at) > self.tolerance_s:
            return (
                f"webhook-timestamp {sent_at} is {abs(now - sent_at):.0f}s away from now, "
                f"outside the {self.tolerance_s:.0f}s tolerance (check the sender's clock)"
            )
        wanted = {
            "webhook-id": msg_id,
            "webhook-timestamp": timestamp,
            "webhook-signature": signatures,
        }
        for webhook in self._webhooks:
            try:
                webhook.verify(body, wanted, json_parse=False)
            except WebhookVerificationError:
                continue
            except (ValueError, binascii.Error):  # an entry without ",", bad base64, not UTF-8
                return "webhook-signature or body is malformed"
            return None
        return signature_header_problem(signatures) or (
            "no v1 signature matches any of the receiver's secrets"
        )

    def token_verified(self, headers: Mapping[str, str], token: int) -> bool:
        """True if ``fencing-token-signature`` binds ``token`` to the (verified) request."""
        return fencing_token_verified(self._keys, headers, token)

    def lookup_problem(self, headers: Mapping[str, str], key: str, *, now: float) -> str | None:
        """None if the lookup of ``key`` is signed with one of our secrets and fresh."""
        return lookup_problem(self._keys, headers, key, now=now, tolerance_s=self.tolerance_s)


def signature_header_problem(signatures: str) -> str | None:
    """Why a ``webhook-signature`` header is not space-separated ``version,base64`` entries.

    Asked only when no signature matched (one authentic entry beside a garbled one is
    accepted, as the library does), to say why in the 401: standardwebhooks 1.1 raised
    ValueError on an entry without a comma, 1.3 just finds no match.
    """
    for entry in signatures.split(" "):
        version, comma, signature = entry.partition(",")
        if not comma or not version or not signature:
            return "webhook-signature is malformed: an entry is not 'version,signature'"
        try:
            base64.b64decode(signature, validate=True)
        except binascii.Error:
            return "webhook-signature is malformed: a signature is not base64"
    return None


def _key(secret: str, position: int) -> bytes:
    try:
        return secret_key(secret)
    except ValueError as exc:  # its text never holds the secret
        raise ValueError(
            str(exc).replace("webhook secret", f"webhook secret #{position}", 1)
        ) from None


def _webhook(secret: str, position: int) -> Webhook:
    try:
        return Webhook(secret)
    except EmptyWebhookSecretError:
        raise ValueError(f"webhook secret #{position} is empty") from None
    except (binascii.Error, ValueError, RuntimeError):
        # Never echo the secret: it would end up in logs.
        raise ValueError(f"webhook secret #{position} is not 'whsec_' followed by base64") from None
