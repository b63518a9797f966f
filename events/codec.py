"""Events on the wire: JSON bytes out, validated (and upcast) events in."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from events.base import Event
from events.model import EVENT_ADAPTER, AnyDeliveryEvent, AnyExecutionEvent
from events.upcasting import upcast


class EventDecodeError(ValueError):
    """Bytes that are not a valid event. ``reason`` says what was wrong, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(event: Event) -> bytes:
    """The event as compact JSON bytes."""
    return event.model_dump_json().encode("utf-8")


def to_record(event: Event) -> dict[str, Any]:
    """The event as a JSON-compatible dict (what ``encode`` writes)."""
    return event.model_dump(mode="json")


def decode(data: bytes | None) -> AnyExecutionEvent | AnyDeliveryEvent:
    """Decode, upcast and validate one record value, or raise ``EventDecodeError``."""
    if data is None:
        raise EventDecodeError("record has no value (tombstone)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventDecodeError(
            f"value is not JSON: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EventDecodeError(f"value is not JSON: {exc}") from None
    return decode_record(record)


def decode_record(record: Any) -> AnyExecutionEvent | AnyDeliveryEvent:
    """Upcast and validate an already-parsed record."""
    if not isinstance(record, dict):
        raise EventDecodeError(f"value is JSON {type(record).__name__}, expected an object")
    if "type" not in record:
        raise EventDecodeError("value has no 'type' field")
    try:
        record = upcast(record)
    except ValueError as exc:
        raise EventDecodeError(str(exc)) from None
    try:
        return EVENT_ADAPTER.validate_python(record)
    except ValidationError as exc:
        raise EventDecodeError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"]) or "value"
        parts.append(f"{where}: {err['msg']}")
    more = f" (+{exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return "invalid event: " + "; ".join(parts) + more
