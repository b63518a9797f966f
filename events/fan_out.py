"""A run record's deliveries, fanned out: the same ``DeliveryRequested`` events on every read.

In the publisher's record mode a ``RunSucceeded`` carries its deliveries (one Kafka record,
atomic without a transaction), and a worker turns each entry into an ordinary
``DeliveryRequested`` on ``ledger.deliveries``. The worker reads at least once, so a crash
mid fan-out makes it fan the run out again: everything of a request is derived from the
run event, never from the reading, so the second copy is the first byte for byte (its
``event_id`` is a UUIDv5 of the run's ``event_id`` and the idempotency key), and the fold,
which dedupes by ``event_id``, and the projections see no difference.

Pure: the publisher builds the requests it returns with it, the worker the ones it writes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import JsonValue

from events.codec import EventDecodeError, decode_record
from events.delivery import DeliveryRequested
from events.execution import RunSucceeded
from events.keys import idempotency_key
from events.payload_hashes import payload_hash

ENTRY_FIELDS = ("event_type", "channel", "recipient", "payload", "slo_seconds")
"""What a run record's entry holds: a ``DeliveryRequested`` less what the run supplies."""

# The levels a payload sits deeper in a run record than in its own request: the run's
# ``deliveries`` list and the entry (events/codec.py limits the whole record's depth).
ENTRY_DEPTH = 2


@dataclass(frozen=True)
class EntryRefused:
    """Entry ``index`` (1-based) of a run record is no valid delivery: ``reason`` says why."""

    index: int
    reason: str


def delivery_entry(request: DeliveryRequested) -> dict[str, JsonValue]:
    """The entry a run record carries for ``request``."""
    return {
        "event_type": request.event_type,
        "channel": request.channel,
        "recipient": request.recipient,
        "payload": request.payload,
        "slo_seconds": request.slo_seconds,
    }


def request_event_id(run_event_id: UUID, key: str) -> UUID:
    """The ``event_id`` of the request for ``key`` fanned out of the run ``run_event_id``."""
    return uuid.uuid5(run_event_id, key)


def fan_out(run: RunSucceeded) -> list[DeliveryRequested | EntryRefused]:
    """One ``DeliveryRequested`` per entry of ``run``, in order, or why the entry is refused
    (checked as the worker checks a ``DeliveryRequested`` record, plus: an entry repeating
    an earlier one's key is refused, as the publisher refuses it)."""
    out: list[DeliveryRequested | EntryRefused] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(run.deliveries, start=1):
        try:
            request = _request(run, entry)
        except EventDecodeError as exc:
            out.append(EntryRefused(index, exc.reason))
            continue
        if (first := seen.get(request.idempotency_key)) is not None:
            out.append(EntryRefused(index, f"repeats delivery {first} (same idempotency key)"))
            continue
        seen[request.idempotency_key] = index
        out.append(request)
    return out


def _request(run: RunSucceeded, entry: Any) -> DeliveryRequested:
    if not isinstance(entry, dict):
        raise EventDecodeError(f"entry is JSON {type(entry).__name__}, expected an object")
    if unknown := sorted(set(entry) - set(ENTRY_FIELDS)):
        raise EventDecodeError(f"entry has unknown fields: {', '.join(unknown)[:200]}")
    if missing := [name for name in ENTRY_FIELDS if name not in entry]:
        raise EventDecodeError(f"entry lacks {', '.join(missing)}")
    names = [entry["event_type"], entry["channel"], entry["recipient"]]
    if not all(isinstance(name, str) for name in names):
        raise EventDecodeError("entry's event_type, channel and recipient must be strings")
    key = idempotency_key(run.run_id, *names)
    try:
        hashed = payload_hash(entry["payload"])
    except Exception as exc:  # noqa: BLE001 - a payload no hash takes: this entry is refused
        raise EventDecodeError(f"payload has no canonical hash: {exc}") from None
    record = {
        **entry,
        "type": DeliveryRequested.TYPE,
        "schema_version": DeliveryRequested.SCHEMA_VERSION,
        "event_id": request_event_id(run.event_id, key),
        "occurred_at": run.occurred_at,
        "producer": run.producer,
        "run_id": run.run_id,
        "idempotency_key": key,
        "payload_hash": hashed,
    }
    request = decode_record(record)
    assert isinstance(request, DeliveryRequested)  # the record's type, set above
    return request
