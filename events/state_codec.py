"""A ``DeliveryState`` as compact JSON: the one codec of the worker's table (and its
changelog) and of the projection's ``state`` column.

Fields by name, times as ISO 8601 with offset, the status and error class as their
values. A reader takes any subset: a field left out reads as its default (so a field
added to the state with a default reads old records), or from ``given`` when the holder
keeps it elsewhere (the projection's row holds the key, the run, the channel...).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from events.delivery_state import DeliveryState, Status
from events.outcomes import ErrorClass, LookupOutcome
from events.waiting import WaitReason

_FIELDS = dataclasses.fields(DeliveryState)
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in _FIELDS if f.default is not dataclasses.MISSING
}
_DEFAULTS["seen"] = ()
_TIMES = frozenset(f.name for f in _FIELDS if "datetime" in str(f.type))
_DROP, _KEEP = object(), object()
_ENCODER = json.JSONEncoder(separators=(",", ":"))


class StateCodec:
    """Writes and reads one form of the state: every field, or (``compact``) only those
    that differ from their defaults; never the fields in ``kept_elsewhere``."""

    def __init__(self, *, kept_elsewhere: Iterable[str] = (), compact: bool = False) -> None:
        self.kept_elsewhere = tuple(kept_elsewhere)
        dropped = frozenset(self.kept_elsewhere)
        # Per field: what to leave out, if anything (every changed state is dumped, so
        # this is one lookup per field, built once).
        self._omit: dict[str, Any] = {
            f.name: _DROP
            if f.name in dropped
            else (_DEFAULTS.get(f.name, _KEEP) if compact else _KEEP)
            for f in _FIELDS
        }

    def dumps(self, state: DeliveryState) -> str:
        """The state as compact JSON."""
        # Not dataclasses.asdict: it deep-copies every value (the payload too) only for
        # the encoder to read it once; that was ~100 us of the worker's three puts per event.
        out: dict[str, Any] = {}
        for name, value in state.__dict__.items():
            omit = self._omit[name]
            if omit is _DROP or (omit is not _KEEP and value == omit):
                continue
            if value is not None and name in _TIMES:
                value = value.isoformat()
            out[name] = value
        return _ENCODER.encode(out)

    def loads(self, text: str | bytes, given: Mapping[str, Any] | None = None) -> DeliveryState:
        """The state ``dumps`` wrote; ``given`` holds the fields kept elsewhere."""
        raw: dict[str, Any] = json.loads(text)
        for name in self.kept_elsewhere:
            raw[name] = (given or {})[name]
        for name in _TIMES.intersection(raw):
            if raw[name] is not None:
                raw[name] = datetime.fromisoformat(raw[name])
        if "status" in raw:
            raw["status"] = Status(raw["status"])
        if raw.get("last_error_class") is not None:
            raw["last_error_class"] = ErrorClass(raw["last_error_class"])
        if raw.get("reconciled") is not None:
            raw["reconciled"] = LookupOutcome(raw["reconciled"])
        if raw.get("waiting") is not None:
            raw["waiting"] = WaitReason(raw["waiting"])
        if "seen" in raw:
            raw["seen"] = tuple(raw["seen"])
        return DeliveryState(**raw)


# The worker's table: the whole state, its payload too (the sender sends it).
_TABLE = StateCodec()


def dumps(state: DeliveryState) -> bytes:
    """The worker table's value for ``state``: every field."""
    return _TABLE.dumps(state).encode()


def loads(data: bytes) -> DeliveryState:
    """The state ``dumps`` wrote."""
    return _TABLE.loads(data)
