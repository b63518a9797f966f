"""Signed outcome events: only a worker can write what a delivery's state follows.

Kafka ACLs are per topic, and an agent needs Write on ``ledger.deliveries`` for its
requests, so an agent's principal could also append a ``DeliveryConfirmed`` with a forged
provider id. With outcome signing on, every event a worker writes there (claims,
outcomes, reconciliations, duplicate reports: every delivery event but
``DeliveryRequested``) carries an Ed25519 signature over its record value in the
``ledger-signature`` header, made with a key only the workers hold. Every reader that
folds the log (the worker, the projector, ``rebuild``, ``verify``) checks it against the
public keys it is given: an outcome without a valid signature is no event of the log —
the worker dead-letters it, the projector skips it. The public keys are not secret, so a
reader can check but not sign. Several keys may be listed during a rotation. A worker
does not check again a record it wrote itself and reads back byte for byte with the
signature it made (streams/own_records.py): that check could only pass.

Operator events (events/operator.py: resolve, redrive) are signed the same way with an
operator key, a separate pair held by whoever may act as an operator (the CLI, the
dashboard): an operator key cannot sign an outcome and a worker key cannot sign an operator
event, so neither an agent nor a worker can settle a delivery in an operator's name.

The budgets topic (events/budgets.py) follows the same split: a ``BudgetSpent`` is a
worker's and carries an outcome signature, a budget set, cleared or released is an
operator's and carries an operator signature.

Keys are 32 raw bytes, base64: ``ledger outcome-keys`` makes a pair.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from config.keys import SIGNING_KEY, VERIFY_KEY, key_bytes
from events.budgets import BudgetOperatorEvent, BudgetSpent
from events.delivery import DeliveryEvent, DeliveryRequested
from events.operator import OperatorEvent

HEADER = "ledger-signature"
Headers = Sequence[tuple[str, bytes]]


def private_key(text: str) -> Ed25519PrivateKey:
    """The signing key from its base64 text; ValueError says what is wrong (never the key)."""
    return Ed25519PrivateKey.from_private_bytes(key_bytes(text, SIGNING_KEY))


def public_key(text: str) -> Ed25519PublicKey:
    """A verification key from its base64 text; ValueError names what is wrong."""
    return Ed25519PublicKey.from_public_bytes(key_bytes(text, VERIFY_KEY))


def public_text(key: Ed25519PrivateKey) -> str:
    """The base64 public key of a signing key."""
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def new_pair() -> tuple[str, str]:
    """A fresh (signing key, verify key), both base64."""
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes_raw()
    return base64.b64encode(raw).decode(), public_text(key)


def needs_signature(event: object) -> bool:
    """Written by workers only: every delivery event but the agents' requests and the
    operators' actions."""
    return isinstance(event, DeliveryEvent) and not isinstance(
        event, DeliveryRequested | OperatorEvent
    )


class OutcomeSigner:
    """Signs the record values of worker-written events."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        """The record headers that carry ``value``'s signature."""
        return [(HEADER, self._key.sign(value))]


class OutcomeVerifier:
    """Checks worker-written events against the workers' public keys, and operator
    events against the operators'."""

    def __init__(
        self, keys: Iterable[Ed25519PublicKey], operator_keys: Iterable[Ed25519PublicKey] = ()
    ) -> None:
        self._keys = tuple(keys)
        self._operator_keys = tuple(operator_keys)

    def refuses(self, event: object, value: bytes, headers: Headers | None) -> str | None:
        """Why this event is not a worker's, or not an operator's (no or a bad
        signature), or None."""
        if isinstance(event, OperatorEvent | BudgetOperatorEvent):
            keys, whose = self._operator_keys, "operator"
        elif needs_signature(event) or isinstance(event, BudgetSpent):
            keys, whose = self._keys, "outcome"
        else:
            return None
        kind = getattr(event, "type", "event")
        signatures = [v for name, v in headers or () if name == HEADER]
        if not signatures:
            return f"{kind} carries no {whose} signature"
        for signature in signatures:
            for key in keys:
                try:
                    key.verify(signature, value)
                except InvalidSignature:
                    continue
                return None
        return f"{kind} has an {whose} signature no verify key accepts ({whose} keys)"


def outcome_signer(signing_key: str | None) -> OutcomeSigner | None:
    """The worker's signer, if it has a signing key."""
    return None if signing_key is None else OutcomeSigner(private_key(signing_key))


def outcome_verifier(
    verify_keys: Iterable[str], signing_key: str | None, operator_keys: Iterable[str] = ()
) -> OutcomeVerifier | None:
    """The check every folding reader makes: on when any key is configured (the verify
    keys, and a worker's own public key), else off (None). ``operator_keys``: the public
    keys operator events are checked against (none: every operator event is refused)."""
    keys = [public_key(k) for k in verify_keys]
    if signing_key is not None:
        keys.append(private_key(signing_key).public_key())
    operators = [public_key(k) for k in operator_keys]
    return OutcomeVerifier(keys, operators) if keys else None
