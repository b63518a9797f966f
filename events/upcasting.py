"""Upcasters: turn a stored older version of an event into the current one, on read.

One function per (type, from_version) step; the chain runs until the current version,
before validation. Stored data never changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from events.model import ALL_EVENT_TYPES
from events.payload_hashes import LEGACY, hash_under

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# A v1 DeliveryRequested had no payload_hash and no SLO: the hash is derived from the
# payload it carried (as v2 writers derived it), and the SLO is the one v1 writers used
# implicitly (5 minutes).
V1_DELIVERY_SLO_SECONDS = 300


def _delivery_requested_v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    upgraded = dict(record)
    upgraded["payload_hash"] = hash_under(LEGACY, record.get("payload"))
    upgraded.setdefault("slo_seconds", V1_DELIVERY_SLO_SECONDS)
    upgraded["schema_version"] = 2
    return upgraded


def _hash_scheme_named_by_prefix(record: dict[str, Any]) -> dict[str, Any]:
    # v3 (and duplicate reports v2) write RFC 8785 hashes, prefixed "jcs-sha256:"; an older
    # record's unprefixed hash keeps its meaning, the legacy scheme (events/payload_hashes.py),
    # so nothing is rewritten: only the version moves.
    return {**record, "schema_version": record["schema_version"] + 1}


def _retry_scheduled_v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    # v1 named no dedupe rule: its retries after UNKNOWN say why only in ``safety``.
    upgraded = dict(record)
    upgraded.setdefault("dedupe_rule", None)
    upgraded["schema_version"] = 2
    return upgraded


def _run_succeeded_v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    # v1 carried no deliveries: its requests were written beside it, in its transaction.
    return {**record, "deliveries": [], "schema_version": 2}


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("delivery.requested", 1): _delivery_requested_v1_to_v2,
    ("delivery.requested", 2): _hash_scheme_named_by_prefix,
    ("delivery.duplicate_requested", 1): _hash_scheme_named_by_prefix,
    ("delivery.retry_scheduled", 1): _retry_scheduled_v1_to_v2,
    ("run.succeeded", 1): _run_succeeded_v1_to_v2,
}


def upcast(record: dict[str, Any]) -> dict[str, Any]:
    """Apply the upcaster chain until the record is at its type's current version."""
    event_type = record.get("type")
    if not isinstance(event_type, str) or event_type not in ALL_EVENT_TYPES:
        return record  # validation reports the unknown type
    cls = ALL_EVENT_TYPES[event_type]
    version = record.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"schema_version must be an integer, got {version!r}")
    if version > cls.SCHEMA_VERSION:
        raise ValueError(
            f"{event_type} schema_version {version} is newer than this reader "
            f"({cls.SCHEMA_VERSION}); upgrade delivery-ledger"
        )
    while version < cls.SCHEMA_VERSION:
        step = UPCASTERS.get((event_type, version))
        if step is None:
            raise ValueError(f"no upcaster for {event_type} schema_version {version}")
        record = step(record)
        version = record["schema_version"]
    return record
