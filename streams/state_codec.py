"""DeliveryState <-> bytes, for the processor's table (and its changelog)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from datetime import datetime
from typing import Any

from streams.state import DeliveryState, Status

_DATETIMES = frozenset(f.name for f in fields(DeliveryState) if "datetime" in str(f.type))


def dumps(state: DeliveryState) -> bytes:
    """Compact JSON; datetimes as ISO 8601 with offset."""
    record: dict[str, Any] = asdict(state)
    for name in _DATETIMES:
        value = record[name]
        if value is not None:
            record[name] = value.isoformat()
    record["status"] = state.status.value
    record["seen"] = list(state.seen)
    return json.dumps(record, separators=(",", ":")).encode()


def loads(data: bytes) -> DeliveryState:
    """The state ``dumps`` wrote."""
    record: dict[str, Any] = json.loads(data)
    for name in _DATETIMES:
        value = record.get(name)
        if value is not None:
            record[name] = datetime.fromisoformat(value)
    record["status"] = Status(record["status"])
    record["seen"] = tuple(record["seen"])
    return DeliveryState(**record)
