"""The worker's fold state of one delivery, as a projection row stores it (compact JSON).

The projection keeps each delivery's ``events.delivery_state.DeliveryState`` and derives
the row's status from it, so the worker and the projection fold the log by literally one
set of rules. Stored: every field that differs from its default, by name (so a field
added to the state with a default reads old rows), times as ISO-8601; not the fields the
row already holds (key, run, channel, ...), which are taken from the row. The payload is
not kept: the ledger tables never held payloads, and no transition reads it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from events.delivery_state import DeliveryState, Status
from events.outcomes import ErrorClass

_FIELDS = dataclasses.fields(DeliveryState)
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in _FIELDS if f.default is not dataclasses.MISSING
}
_DEFAULTS["seen"] = ()
_TIMES = frozenset(f.name for f in _FIELDS if "datetime" in str(f.type))
# Held by the row's own columns of the same name, set once by the request.
_FROM_ROW = (
    "idempotency_key",
    "run_id",
    "event_type",
    "channel",
    "recipient",
    "payload_hash",
    "slo_seconds",
)
_DROPPED = frozenset({"payload", *_FROM_ROW})


# Per field: what to leave out, if anything (every changed delivery of every batch is
# dumped, so this is one lookup per field, and one encoder built once).
_DROP, _KEEP = object(), object()
_OMIT: dict[str, Any] = {
    f.name: _DROP if f.name in _DROPPED else _DEFAULTS.get(f.name, _KEEP) for f in _FIELDS
}
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def dump_state(state: DeliveryState) -> str:
    """The state as compact JSON, default-valued fields and the payload left out."""
    out: dict[str, Any] = {}
    for name, value in state.__dict__.items():
        omit = _OMIT[name]
        if omit is _DROP or (omit is not _KEEP and value == omit):
            continue
        if value is not None and name in _TIMES:
            value = value.isoformat()
        out[name] = value
    return _ENCODER.encode(out)


def load_state(text: str, row: Mapping[str, Any]) -> DeliveryState:
    """The state ``dump_state`` wrote into ``row`` (its payload is None)."""
    raw: dict[str, Any] = json.loads(text)
    for name in _FROM_ROW:
        raw[name] = row[name]
    for name in _TIMES.intersection(raw):
        if raw[name] is not None:
            raw[name] = datetime.fromisoformat(raw[name])
    if "status" in raw:
        raw["status"] = Status(raw["status"])
    if raw.get("last_error_class") is not None:
        raw["last_error_class"] = ErrorClass(raw["last_error_class"])
    if "seen" in raw:
        raw["seen"] = tuple(raw["seen"])
    return DeliveryState(payload=None, **raw)
