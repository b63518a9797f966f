"""Payload hashes: which canonical JSON a hash was taken over, said by the hash itself.

Two schemes, told apart by a prefix:

* ``jcs-sha256:<64 hex>`` (written from ``delivery.requested`` v3 on): sha256 of the
  payload's RFC 8785 (JCS) canonical JSON, the form every language's JCS library writes,
  so a producer in TypeScript or Go hashes the same payload to the same string.
* ``<64 hex>`` without a prefix (every hash written before): sha256 of
  ``events.keys.canonical_json``, Python's sorted-key ``json.dumps``. It differs from JCS
  for floats (``1.0`` stays ``1.0``, ``1e21`` is ``1e+21``) and for key order beyond the
  Basic Multilingual Plane (code points, not UTF-16 units). Read forever, never written.

Stored hashes are never rewritten. Two hashes are compared under one scheme
(``comparable``): as they are when they share one, else recomputed from the payloads
they belong to.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Annotated, Any

import rfc8785
from pydantic import Field

from events.keys import canonical_json

JCS = "jcs-sha256"
LEGACY = "sorted-json-sha256"  # the name of the unprefixed scheme, for messages and docs
CURRENT = JCS
PAYLOAD_HASH_PATTERN = r"^(jcs-sha256:)?[0-9a-f]{64}$"
_FORM = re.compile(PAYLOAD_HASH_PATTERN)
# RFC 8785 numbers are IEEE 754 doubles: integers beyond 2**53 - 1 have no exact form.
MAX_EXACT_INT = 2**53 - 1

PayloadHash = Annotated[
    str,
    Field(
        pattern=PAYLOAD_HASH_PATTERN,
        description=(
            "sha256 of the payload's canonical JSON, hex: 'jcs-sha256:' + hex over RFC 8785 "
            "(written now), or bare hex over sorted-key JSON (records written before)"
        ),
    ),
]


class PayloadHashError(ValueError):
    """A payload with no RFC 8785 form; the message names the field, in one line."""


def payload_hash(payload: Any) -> str:
    """The hash new events carry: ``jcs-sha256:`` + sha256 (hex) of RFC 8785 JSON."""
    return hash_under(CURRENT, payload)


def jcs_json(payload: Any, where: str = "payload") -> bytes:
    """The RFC 8785 canonical JSON of ``payload``, or ``PayloadHashError`` naming the
    field that has none (NaN, an infinity, an integer beyond 2**53 - 1, a lone surrogate)."""
    try:
        return rfc8785.dumps(payload)
    except (rfc8785.CanonicalizationError, UnicodeError) as exc:
        # (rfc8785 0.1.4 sorts keys by their UTF-16 form: a lone surrogate in a key raises
        # UnicodeEncodeError there, not its own error.) Only now walk the payload for the
        # field at fault: every decoded request is hashed, and the walk costs as much again.
        why = jcs_refusal(payload, where) or f"{where} has no RFC 8785 (JCS) form: {exc}"
        raise PayloadHashError(why) from None


def jcs_refusal(payload: Any, where: str = "payload") -> str | None:
    """Why ``payload`` has no RFC 8785 form, naming the first field at fault, or None.

    Iterative, so a deeply nested payload cannot exhaust the stack."""
    stack: list[tuple[str, Any]] = [(where, payload)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path} is {item}: RFC 8785 (JCS) JSON has no NaN or Infinity"
        if isinstance(item, int) and abs(item) > MAX_EXACT_INT:
            return (
                f"{path} is {item}, beyond the exact integer range of RFC 8785 (JCS) JSON, "
                "+-(2**53 - 1): send it as a string"
            )
        if isinstance(item, str) and not _encodable(item):
            return f"{path} holds a lone surrogate (not encodable as UTF-8)"
        if isinstance(item, dict):
            for name, child in reversed(item.items()):
                if not isinstance(name, str) or not _encodable(name):
                    return f"{path} has a key that is not a UTF-8 string"
                stack.append((f"{path}.{name}", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def scheme_of(stored: str) -> str:
    """The scheme a stored hash was taken under (``JCS`` or ``LEGACY``)."""
    if not _FORM.match(stored):
        raise ValueError(f"not a payload hash: {stored[:80]!r}")
    return JCS if stored.startswith(f"{JCS}:") else LEGACY


def hash_under(scheme: str, payload: Any) -> str:
    """``payload``'s hash under ``scheme``, spelled as that scheme stores it."""
    if scheme == JCS:
        return f"{JCS}:{hashlib.sha256(jcs_json(payload)).hexdigest()}"
    if scheme == LEGACY:
        return hashlib.sha256(canonical_json(payload)).hexdigest()
    raise ValueError(f"unknown payload hash scheme {scheme!r}")


def matches(stored: str, payload: Any) -> bool:
    """Whether ``stored`` is ``payload``'s hash under the scheme ``stored`` names."""
    return hash_under(scheme_of(stored), payload) == stored


def comparable(first: tuple[str, Any], second: tuple[str, Any]) -> tuple[str, str]:
    """Two ``(stored hash, payload)`` pairs as two hashes under one scheme: as stored when
    they share a scheme; else both under JCS, recomputed from the payloads; else (a
    payload with no JCS form, written before JCS) both under the legacy scheme.

    So a payload requested before the upgrade and requested again after it hashes equal
    exactly when the payloads are equal JSON: no conflict appears that JCS would not see,
    and none is missed (equal hashes under either scheme mean equal JSON values)."""
    if scheme_of(first[0]) == scheme_of(second[0]):
        return first[0], second[0]
    try:
        return _under(JCS, first), _under(JCS, second)
    except PayloadHashError:
        return _under(LEGACY, first), _under(LEGACY, second)


def _under(scheme: str, pair: tuple[str, Any]) -> str:
    stored, payload = pair
    return stored if scheme_of(stored) == scheme else hash_under(scheme, payload)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
