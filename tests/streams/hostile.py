"""Hostile records for the property test that tries to stop a partition.

Every event type, built valid, then one or more of its fields replaced by an extreme value
of that field's kind (times at and past datetime's limits, integers past 63 bits, empty and
huge strings, unicode edge cases, payloads nested to the limit, NaN), written as raw JSON
the way anyone with write access to a topic can. Each delivery event other than a request
follows a valid request of its own key, so the fold meets the extreme value on a live
delivery, not only the "no request" refusal.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from events.delivery import new_delivery_requested
from events.keys import idempotency_key
from events.model import ALL_EVENT_TYPES

T = datetime(2026, 6, 1, tzinfo=UTC)

TIMES = [
    "0001-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "1999-12-31T23:59:59.999999Z",
    "2000-01-01T00:00:00Z",
    "2199-12-31T23:59:59.999999Z",
    "2200-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999Z",
    "2100-06-01T00:00:00+14:00",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
]
INTEGERS = [-(2**63), -1, 0, 1, 2, 2**31, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64]
INTEGERS += [10**12, 10**30, 10**4000]
TEXTS = ["", "x", "x" * 200, "x" * 201, "x" * 1000, "x" * 1001, "x" * 4000, "x" * 4001]
TEXTS += ["x" * 200_000, "\u2028\u2029\u0085", "\U0010ffff" * 3, "\ud800", "\x00", "a\r\nb"]
TEXTS += ["é" * 2500, "../../../etc/passwd", "%00%0a", "\u202e\u0301"]
UUIDS = ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff", ""]
FLOATS = [float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 5e-324]


def nested(depth: int) -> Any:
    """A payload nested ``depth`` levels deep."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


PAYLOADS: list[Any] = [None, {}, [], nested(63), nested(64), nested(65), list(range(20_000))]
PAYLOADS += [{"f": f} for f in FLOATS] + [{"s": s} for s in TEXTS[-6:]] + [{"n": 2**80}]

# What kind of value each field holds, by name: the extremes come from that kind.
KINDS: dict[str, str] = {
    "occurred_at": "time",
    "lease_expires_at": "time",
    "retry_at": "time",
    "schema_version": "int",
    "attempt": "int",
    "next_attempt": "int",
    "attempts": "int",
    "fencing_token": "int",
    "slo_seconds": "int",
    "http_status": "int",
    "event_id": "uuid",
    "duplicate_event_id": "uuid",
    "payload": "json",
}


def kind_of(name: str) -> str:
    """The kind of a field (``text`` unless listed)."""
    return KINDS.get(name, "text")


def extremes(kind: str) -> st.SearchStrategy[Any]:
    """Extreme values of one kind, with hypothesis' own on top."""
    match kind:
        case "time":
            return st.sampled_from(TIMES) | st.datetimes(timezones=st.sampled_from([UTC])).map(
                lambda d: d.isoformat()
            )
        case "int":
            return st.sampled_from(INTEGERS) | st.integers()
        case "uuid":
            return st.sampled_from(UUIDS) | st.uuids().map(str)
        case "json":
            return st.sampled_from(PAYLOADS) | st.recursive(
                st.none() | st.booleans() | st.floats() | st.text() | st.integers(),
                lambda inner: (
                    st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=4)
                ),
                max_leaves=20,
            )
    return st.sampled_from(TEXTS) | st.text()


@dataclass(frozen=True)
class HostileRecord:
    """One raw record, and what the test knows of it."""

    topic: str  # "runs" or "deliveries"
    key: bytes
    value: bytes
    event_type: str
    field: str  # "" for the valid request that precedes a delivery event
    kind: str
    # A run record's entries (the record mode): the key of its valid entry, which must
    # arrive once if the record decodes, then the hostile entry's, which may arrive at most
    # once.
    fanned: tuple[str, ...] = ()


def valid_event(event_type: str, run_id: str, recipient: str) -> dict[str, Any]:
    """A valid event of ``event_type`` for the delivery (or run) of ``run_id``, as JSON."""
    key = idempotency_key(run_id, "run.succeeded", "webhook", recipient)
    common: dict[str, Any] = {
        "schema_version": ALL_EVENT_TYPES[event_type].SCHEMA_VERSION,
        "event_id": str(uuid.uuid4()),
        "occurred_at": T.isoformat(),
        "producer": "hostile",
        "type": event_type,
        "run_id": run_id,
    }
    if event_type.startswith("run."):
        run_extra: dict[str, dict[str, Any]] = {
            "run.started": {"agent": "a"},
            "run.succeeded": {"result_hash": "h"},
            "run.failed": {"error": "e"},
            "run.marked_unknown": {"reason": "r"},
        }
        return common | run_extra[event_type]
    attempt = {"attempt": 1, "fencing_token": 1}
    later = (T + timedelta(seconds=30)).isoformat()
    # Unsigned, as anyone with write access can write them: the worker dead-letters them.
    operator = {"operator": "op", "reason": "r", "scope": "key", "fencing_token": 1}
    operator |= {"seen_status": "UNKNOWN"}
    extra: dict[str, dict[str, Any]] = {
        "delivery.claimed": attempt | {"worker_id": "w-hostile", "lease_expires_at": later},
        "delivery.sent": attempt
        | {"worker_id": "w-hostile", "provider_message_id": "m", "provider_status": "queued"}
        | {"http_status": 202},
        "delivery.confirmed": attempt
        | {"source": "send", "provider_message_id": "m", "evidence": "e"},
        "delivery.not_sent": attempt
        | {"worker_id": "w-hostile", "error_class": "fenced", "reason": "r"},
        "delivery.unknown": attempt | {"error_class": "timeout_after_write", "reason": "r"},
        "delivery.reconciled": attempt
        | {"outcome": "not_found", "provider_message_id": None, "evidence": "e"},
        "delivery.retry_scheduled": {"attempt": 1, "next_attempt": 2, "retry_at": later}
        | {"error_class": "http_5xx", "safety": "s", "dedupe_rule": None},
        "delivery.failed": {"attempts": 1, "error_class": "http_4xx", "reason": "r"},
        "delivery.resolved": operator | {"outcome": "delivered", "receiver_id": None},
        "delivery.redrive_requested": operator,
        "delivery.held": {"reason": "paused", "detail": "d", "recheck_at": later},
        "delivery.duplicate_requested": {
            "duplicate_event_id": str(uuid.uuid4()),
            "payload_hash": "0" * 64,
            "original_payload_hash": "1" * 64,
            "outcome": "conflict",
        },
    }
    if event_type == "delivery.requested":
        request = new_delivery_requested(
            run_id=run_id,
            event_type="run.succeeded",
            channel="webhook",
            recipient=recipient,
            payload={"n": 1},
            slo_seconds=60,
            producer="hostile",
            occurred_at=T,
        )
        return request.model_dump(mode="json")
    return common | {"idempotency_key": key} | extra[event_type]


def _raw(topic: str, event: dict[str, Any]) -> HostileRecord:
    key = event.get("idempotency_key") if topic == "deliveries" else event.get("run_id")
    return HostileRecord(
        topic,
        str(key).encode("utf-8", "surrogatepass"),
        # Escaped (\\uXXXX), as JSON writers do: a lone surrogate reaches the decoder whole.
        json.dumps(event).encode(),
        str(event.get("type")),
        "",
        "",
    )


@st.composite
def hostile_records(draw: st.DrawFn, tag: str, recipient: str) -> list[HostileRecord]:
    """For every event type, one record with drawn fields set to extremes; then, for every
    field kind, one more record of a type that has such a field (so each example reaches
    every type and every kind). A delivery event follows a valid request of its own key."""
    records: list[HostileRecord] = []
    kinds = sorted(set(KINDS.values()) | {"text"})
    plan: list[tuple[str, str | None]] = [(t, None) for t in sorted(ALL_EVENT_TYPES)]
    plan += [(draw(st.sampled_from(_types_with(kind))), kind) for kind in kinds]
    for number, (event_type, kind) in enumerate(plan):
        run_id = f"hostile-{tag}-{number}"
        topic = "runs" if event_type.startswith("run.") else "deliveries"
        url = f"{recipient}/{run_id}"
        event = valid_event(event_type, run_id, url)
        if topic == "deliveries" and event_type != "delivery.requested":
            records.append(_raw(topic, valid_event("delivery.requested", run_id, url)))
        choices = sorted(f for f in set(event) - {"type"} if kind in (None, kind_of(f)))
        fields = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=3))
        for field in dict.fromkeys(fields):
            event[field] = draw(extremes(kind_of(field)))
        raw = _raw(topic, event)
        records.append(
            HostileRecord(raw.topic, raw.key, raw.value, event_type, fields[0], kind_of(fields[0]))
        )
    records.append(draw(hostile_entries(f"hostile-{tag}-entries", recipient)))
    return records


ENTRY_KINDS = {"payload": "json", "slo_seconds": "int"}


@st.composite
def hostile_entries(draw: st.DrawFn, run_id: str, recipient: str) -> HostileRecord:
    """A run record of the record mode carrying a valid entry and one with extreme fields:
    the fan-out must send the first, refuse or send the second once, and go on."""
    # The valid entry goes to a path the receiver accepts (one segment below /hooks/).
    hooks = recipient[: recipient.index("/hooks/") + len("/hooks/")]
    entries: list[dict[str, Any]] = [
        {
            "event_type": "run.succeeded",
            "channel": "webhook",
            "recipient": f"{hooks}{run_id}-{n}",
            "payload": {"n": n},
            "slo_seconds": 60,
        }
        for n in range(2)
    ]
    fields = draw(st.lists(st.sampled_from(sorted(entries[1])), min_size=1, max_size=3))
    for field in dict.fromkeys(fields):
        entries[1][field] = draw(extremes(ENTRY_KINDS.get(field, "text")))
    event = valid_event("run.succeeded", run_id, recipient) | {"deliveries": entries}
    raw = _raw("runs", event)
    keys = [
        idempotency_key(run_id, str(e["event_type"]), str(e["channel"]), str(e["recipient"]))
        for e in entries
    ]
    kind = ENTRY_KINDS.get(fields[0], "text")
    return HostileRecord(
        "runs", raw.key, raw.value, "run.succeeded", f"deliveries.{fields[0]}", kind, tuple(keys)
    )


def _types_with(kind: str) -> list[str]:
    """The event types that have a field of ``kind``."""
    return sorted(
        t
        for t, cls in ALL_EVENT_TYPES.items()
        if any(kind_of(f) == kind for f in cls.model_fields if f != "type")
    )
