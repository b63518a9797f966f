"""Events on the wire: JSON bytes out, validated (and upcast) events in."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from events.base import Event
from events.bounds import check_json_values
from events.model import EVENT_ADAPTER, AnyDeliveryEvent, AnyExecutionEvent
from events.upcasting import upcast

# No event nests more than a few levels; a payload may nest more, but not without bound.
# Deeper records are refused before validation (a 10 KB record nested 5,000 deep used to
# raise RecursionError and stop the worker for good).
MAX_DEPTH = 64
# Above the largest event the publisher writes (a 256 KB payload, escaped, plus the
# envelope); Kafka's own default limit is 1 MB.
MAX_RECORD_BYTES = 1024 * 1024


class EventDecodeError(ValueError):
    """Bytes that are not a valid event. ``reason`` says what was wrong, in one line."""

    def __init__(self, reason: str) -> None:
        reason = _bounded(reason, 600)
        super().__init__(reason)
        self.reason = reason


def encode(event: Event) -> bytes:
    """The event as compact JSON bytes."""
    return event.model_dump_json().encode("utf-8")


def decode(data: bytes | None) -> AnyExecutionEvent | AnyDeliveryEvent:
    """Decode, upcast and validate one record value, or raise ``EventDecodeError``.

    Whatever is wrong with the bytes, the only exception is ``EventDecodeError``, with one
    line saying what: a record must never be able to stop the reader that reads it.
    """
    if data is None:
        raise EventDecodeError("record has no value (tombstone)")
    if len(data) > MAX_RECORD_BYTES:
        raise EventDecodeError(f"record is {len(data)} bytes, over the limit of {MAX_RECORD_BYTES}")
    try:
        return _decode(data)
    except EventDecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of bad bytes is a bad record
        raise EventDecodeError(
            f"could not decode: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def _decode(data: bytes) -> AnyExecutionEvent | AnyDeliveryEvent:
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
    except RecursionError:
        raise EventDecodeError(f"value nests deeper than {MAX_DEPTH} levels") from None
    if (depth := json_depth(record)) > MAX_DEPTH:
        raise EventDecodeError(f"value nests {depth} levels deep, over the limit of {MAX_DEPTH}")
    if (unfit := check_json_values(record)) is not None:
        raise EventDecodeError(f"value is not an event: {unfit}")
    return decode_record(record)


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests objects and arrays (iteratively: no recursion limit)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            return level  # deep enough to refuse; no need to walk the rest
        stack.extend((child, level + 1) for child in children)
    return deepest


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
    return "invalid event: " + "; ".join(_bounded(p, 200) for p in parts) + more


def _bounded(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters: a reason quotes the bad value, which may
    be 200,000 characters long or span lines."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
