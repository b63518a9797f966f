"""Records read from the log: a position, and the decoded event or why it did not decode."""

from __future__ import annotations

from dataclasses import dataclass

from clients.outcome_signing import Headers, OutcomeVerifier
from events.base import Event
from events.budgets import BudgetDecodeError, BudgetEvent, decode_budget_record
from events.codec import EventDecodeError, decode
from events.endpoints import (
    EndpointDecodeError,
    EndpointEvent,
    decode_endpoint_record,
)
from events.model import DeliveryEvent
from events.refusal import Refuser, refusal
from events.topics import record_key
from projections.fold import LogEvent, Position


@dataclass(frozen=True)
class LogRecord:
    """One committed record: where it was, and its event or the reason it has none."""

    position: Position
    event: LogEvent | None
    reason: str | None = None
    # The original bytes, for a dead letter if the record is refused.
    key: bytes | None = None
    value: bytes | None = None


def decode_at(
    topic: str,
    partition: int,
    offset: int,
    value: bytes | None,
    key: bytes | None = None,
    holds: type[Event] | None = None,
    verifier: OutcomeVerifier | None = None,
    headers: Headers | None = None,
) -> LogRecord:
    """Decode one record value; an undecodable one keeps its reason and bytes instead of
    raising. With ``holds`` (the topic's kind of event), the worker's record rules apply
    too: an event of the other kind, or a record key that is not the event's, is no event
    of the log (the worker dead-letters such a record; the projection must not fold it).
    With ``verifier`` (outcome signing on), neither is a worker-written event whose
    signature (in ``headers``) does not verify."""
    where = Position(topic, partition, offset)
    if holds is EndpointEvent:
        return _endpoint_at(where, value, key)
    if holds is BudgetEvent:
        return _budget_at(where, value, key, verifier, headers)
    try:
        return _decode_at(where, value, key, holds, verifier, headers)
    except Exception as exc:  # noqa: BLE001 - the record guard: any failure is this record's
        return LogRecord(
            where, None, refusal(Refuser.READER, topic, partition, offset, exc), key, value
        )


def _endpoint_at(where: Position, value: bytes | None, key: bytes | None) -> LogRecord:
    """A record of the endpoint registry: its event, keyed by its endpoint id."""
    try:
        event = decode_endpoint_record(value, key)
    except EndpointDecodeError as exc:
        return LogRecord(where, None, str(exc), key, value)
    return LogRecord(where, event, None, key, value)


def _budget_at(
    where: Position,
    value: bytes | None,
    key: bytes | None,
    verifier: OutcomeVerifier | None,
    headers: Headers | None,
) -> LogRecord:
    """A record of the budgets topic, as every worker reads it (streams/budget_gate.py):
    keyed by its agent, signed as its writer must sign it (operator or worker). What the
    workers skip, the live projector dead-letters (projections/deadletters.py)."""
    try:
        event = decode_budget_record(value, key)
    except BudgetDecodeError as exc:
        return LogRecord(where, None, str(exc), key, value)
    if verifier is not None and (forged := verifier.refuses(event, value or b"", headers)):
        return LogRecord(where, None, forged, key, value)
    return LogRecord(where, event, None, key, value)


def _decode_at(
    where: Position,
    value: bytes | None,
    key: bytes | None,
    holds: type[Event] | None,
    verifier: OutcomeVerifier | None,
    headers: Headers | None,
) -> LogRecord:
    topic = where.topic
    try:
        event = decode(value)
    except EventDecodeError as exc:
        return LogRecord(where, None, exc.reason, key, value)
    if holds is not None and not isinstance(event, holds):
        reason = f"{event.type} does not belong on the {topic} topic"
        return LogRecord(where, None, reason, key, value)
    if key is not None and key != record_key(event):
        which = "idempotency_key" if isinstance(event, DeliveryEvent) else "run_id"
        reason = f"record key does not match the event's {which}"
        return LogRecord(where, None, reason, key, value)
    if verifier is not None and (forged := verifier.refuses(event, value or b"", headers)):
        return LogRecord(where, None, forged, key, value)
    return LogRecord(where, event, None, key, value)
