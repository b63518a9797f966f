"""One-line, human-readable renderings of replayed events."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.replay import ReplayedRecord

SKIP = {
    "type",
    "schema_version",
    "event_id",
    "occurred_at",
    "producer",
    "run_id",
    "idempotency_key",
    "payload",
}


def event_line(record: ReplayedRecord) -> str:
    """``time topic/partition@offset type run key details``."""
    where = f"{record.topic}/{record.partition}@{record.offset}"
    if record.event is None:
        stamp = datetime.fromtimestamp(record.timestamp_ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]
        return f"{stamp} {where} UNDECODABLE {record.error}"
    event = record.event
    stamp = event.occurred_at.strftime("%H:%M:%S.%f")[:-3]
    key = getattr(event, "idempotency_key", None)
    details = " ".join(
        f"{name}={value}"
        for name, value in event.model_dump(mode="json").items()
        if name not in SKIP and value is not None
    ).replace(f"payload_hash={getattr(event, 'payload_hash', '')}", "")
    key_part = f" key={key[:12]}" if key else ""
    return f"{stamp} {where} {event.type} run={event.run_id}{key_part} {details}".rstrip()
