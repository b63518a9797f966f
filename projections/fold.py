"""Folding events into ledger rows: pure code, no I/O, no clock.

A ``Batch`` holds the rows one batch of events touches (pre-loaded from the store) and
records which of them changed. Every time written comes from an event's
``occurred_at`` (or a time the event carries), so folding the same log always yields
the same rows: that is what makes ``ledger rebuild`` equal to the live projection.

Each entity's events share one Kafka partition (runs by ``run_id``, deliveries by
idempotency key), so they arrive in order; nothing here depends on the order of
events of *different* entities.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from events.budgets import AnyBudgetEvent, BudgetBook, BudgetEvent
from events.delivery import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryEvent,
    DeliveryFailed,
    DeliveryNotSent,
    DeliveryReconciled,
    DeliveryRequested,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
)
from events.delivery_state import DeliveryState, Status, operator_refusal
from events.delivery_state import apply as fold_delivery
from events.endpoints import AnyEndpointEvent, EndpointEvent
from events.execution import RunFailed, RunMarkedUnknown, RunStarted, RunSucceeded
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from events.operator import DeliveryResolved, OperatorEvent
from events.state_codec import StateCodec
from events.waiting import DeliveryHeld
from projections.budget_fold import apply_budget
from projections.schema import timestamp

Row = dict[str, Any]
AttemptKey = tuple[str, int]
# Status.public is a property that compares and looks up on every call; once per event.
_PUBLIC = {status: status.public for status in Status}
# The worker's fold state of each delivery, in the row's ``state`` column: only what
# differs from the defaults, and not what the row's own columns of the same name hold
# (set once by the request). Not the payload: the ledger tables never held payloads, and
# no transition reads it.
_FROM_ROW = (
    "idempotency_key",
    "run_id",
    "event_type",
    "channel",
    "recipient",
    "payload_hash",
    "slo_seconds",
)
_ROW_STATE = StateCodec(kept_elsewhere=("payload", *_FROM_ROW), compact=True)


@dataclass(frozen=True)
class Position:
    """Where a record sits in the log."""

    topic: str
    partition: int
    offset: int


@dataclass
class Batch:
    """The rows one batch touches, and which of them changed."""

    runs: dict[str, Row] = field(default_factory=dict)
    deliveries: dict[str, Row] = field(default_factory=dict)
    attempts: dict[AttemptKey, Row] = field(default_factory=dict)
    duplicates: list[Row] = field(default_factory=list)
    operator_actions: list[Row] = field(default_factory=list)
    endpoints: dict[str, Row] = field(default_factory=dict)
    dirty_endpoints: set[str] = field(default_factory=set)
    # Each agent's budget book (projections/budgets.py), and per agent the time of its
    # last event folded in this batch.
    budget_books: dict[str, BudgetBook] = field(default_factory=dict)
    dirty_budgets: dict[str, str] = field(default_factory=dict)
    skipped: list[Row] = field(default_factory=list)
    dirty_runs: set[str] = field(default_factory=set)
    dirty_deliveries: set[str] = field(default_factory=set)
    dirty_attempts: set[AttemptKey] = field(default_factory=set)
    # The worker's fold state of each delivery touched, parsed once per batch.
    states: dict[str, DeliveryState] = field(default_factory=dict)
    applied: int = 0

    def changed_deliveries(self) -> list[Row]:
        """The changed delivery rows, in key order, each with its state serialised."""
        rows = []
        for key in sorted(self.dirty_deliveries):
            row = self.deliveries[key]
            row["state"] = _ROW_STATE.dumps(self.states[key])
            rows.append(row)
        return rows

    def skip(self, where: Position, reason: str) -> None:
        """Record a record we could not apply, and why."""
        self.skipped.append(
            {
                "topic": where.topic,
                "kafka_partition": where.partition,
                "record_offset": where.offset,
                "reason": reason[:1000],
            }
        )


LogEvent = AnyExecutionEvent | AnyDeliveryEvent | AnyEndpointEvent | AnyBudgetEvent


def apply(batch: Batch, where: Position, event: LogEvent) -> None:
    """Fold one decoded event into the batch's rows."""
    if isinstance(event, DeliveryEvent):
        _apply_delivery(batch, where, event)
    elif isinstance(event, EndpointEvent):
        _apply_endpoint(batch, event)
    elif isinstance(event, BudgetEvent):
        apply_budget(batch.budget_books, batch.dirty_budgets, event)
    else:
        _apply_run(batch, event)
    batch.applied += 1


# Endpoints ------------------------------------------------------------------------


def _apply_endpoint(batch: Batch, event: EndpointEvent) -> None:
    """The endpoint's row as its newest version says (events/endpoints.py ``fold``)."""
    row = batch.endpoints.get(event.endpoint_id)
    if row is not None and row["version"] >= event.endpoint.version:
        return
    state = event.endpoint
    expiries = [s.expires_at for s in state.secrets if s.expires_at is not None]
    batch.endpoints[event.endpoint_id] = {
        "endpoint_id": state.endpoint_id,
        "channel": state.spec.channel,
        "address": state.spec.address,
        "state": state.state,
        "paused_by": state.paused.by if state.paused else None,
        "paused_reason": state.paused.reason if state.paused else None,
        "paused_at": timestamp(state.paused.at) if state.paused else None,
        "disabled_by": state.disabled.by if state.disabled else None,
        "disabled_reason": state.disabled.reason if state.disabled else None,
        "disabled_at": timestamp(state.disabled.at) if state.disabled else None,
        "circuit": state.circuit,
        "circuit_since": timestamp(state.breaker.since) if state.breaker else None,
        "circuit_probe": state.breaker.probe if state.breaker else None,
        "lookup_url": state.spec.lookup_url,
        "receiver_dedupes": int(state.spec.receiver_dedupes),
        "rate_limit_per_s": None
        if state.spec.rate_limit_per_s is None
        else repr(state.spec.rate_limit_per_s),
        "slo_s": state.spec.slo_s,
        "secrets": len(state.secrets),
        "rotation_ends_at": timestamp(max(expiries)) if expiries else None,
        "version": state.version,
        "registered_at": timestamp(state.registered_at),
        "updated_at": timestamp(state.updated_at),
    }
    batch.dirty_endpoints.add(event.endpoint_id)


# Execution ------------------------------------------------------------------------


def _apply_run(batch: Batch, event: AnyExecutionEvent) -> None:
    at = timestamp(event.occurred_at)
    row = batch.runs.get(event.run_id)
    if row is None:
        row = {
            "run_id": event.run_id,
            "status": "RUNNING",
            "agent": None,
            "result_hash": None,
            "error": None,
            "started_at": None,
            "finished_at": None,
            "events": 0,
            "created_at": at,
            "updated_at": at,
            "producer": event.producer,
        }
        batch.runs[event.run_id] = row
    row["events"] += 1
    row["updated_at"] = at
    if isinstance(event, RunStarted):
        row["started_at"] = row["started_at"] or at
        row["agent"] = event.agent
    elif isinstance(event, RunSucceeded):
        row.update(status="SUCCEEDED", result_hash=event.result_hash, finished_at=at)
    elif isinstance(event, RunFailed):
        # A recorded success is the stronger fact; a later failure report does not undo it.
        if row["status"] != "SUCCEEDED":
            row.update(status="FAILED", error=event.error, finished_at=at)
    elif isinstance(event, RunMarkedUnknown) and row["status"] == "RUNNING":
        row.update(status="UNKNOWN", error=event.reason)
    batch.dirty_runs.add(event.run_id)


# Delivery -------------------------------------------------------------------------
#
# A delivery's row is derived from the worker's own fold state (events/delivery_state.py),
# kept in the row's ``state`` column: the worker and the projection fold the log by one
# set of rules, late and stale outcomes included. The attempts table stays a history: it
# records what every attempt reported, current or superseded.


def state_of_row(row: Row) -> DeliveryState:
    """The worker's fold state of a delivery, from its projection row (every column)."""
    given = {"payload": None, **{name: row[name] for name in _FROM_ROW}}
    return _ROW_STATE.loads(row["state"], given)


def _state(batch: Batch, key: str, row: Row) -> DeliveryState:
    state = batch.states.get(key)
    if state is None:
        state = batch.states[key] = state_of_row(row)
    return state


def _apply_delivery(batch: Batch, where: Position, event: AnyDeliveryEvent) -> None:
    key = event.idempotency_key
    at = timestamp(event.occurred_at)
    row = batch.deliveries.get(key)
    if row is None:
        if isinstance(event, DeliveryRequested):
            _requested(batch, event, at)
        else:
            batch.skip(where, f"{event.type} for key {key} that was never requested")
        return
    before = _state(batch, key, row)
    after = fold_delivery(before, event)
    if after is before:
        return  # a redelivered record: the worker's fold ignores it, and so do we
    if isinstance(event, OperatorEvent):
        batch.operator_actions.append(_operator_action(event, operator_refusal(before, event), at))
    assert after is not None
    batch.states[key] = after
    row["updated_at"] = at
    batch.dirty_deliveries.add(key)
    if isinstance(event, DeliveryRequested):
        # The same logical delivery requested again: the first request stands; the
        # state machine reports it as DuplicateDeliveryRequest.
        row["requests"] += 1
    elif isinstance(event, DuplicateDeliveryRequest):
        batch.duplicates.append(
            {
                "event_id": str(event.event_id),
                "idempotency_key": key,
                "run_id": event.run_id,
                "duplicate_event_id": str(event.duplicate_event_id),
                "payload_hash": event.payload_hash,
                "original_payload_hash": event.original_payload_hash,
                "outcome": event.outcome,
                "occurred_at": at,
            }
        )
    elif isinstance(event, DeliveryFailed):
        last = batch.attempts.get((key, event.attempts))
        if (
            last is not None
            and after.status is Status.FAILED
            and before.status is not Status.FAILED
        ):
            last.update(outcome="FAILED", error_class=event.error_class, reason=event.reason)
            last.update(failed_at=at, finished_at=last["finished_at"] or at, updated_at=at)
            batch.dirty_attempts.add((key, event.attempts))
    elif not isinstance(event, OperatorEvent | DeliveryHeld):
        _attempt_event(batch, row, event, at)
    _derive(row, before, after, at)


def _derive(row: Row, before: DeliveryState, after: DeliveryState, at: str) -> None:
    """The row's columns that follow from the worker's state."""
    retry_at = after.retry_at if after.status is Status.RETRY_SCHEDULED else None
    row["status"] = _PUBLIC[after.status]
    row["attempts"] = after.attempt
    row["fencing_token"] = after.fencing_token
    row["provider_message_id"] = after.provider_message_id
    row["last_error_class"] = after.last_error_class
    row["reconciliation"] = after.reconciled
    row["next_attempt_at"] = None if retry_at is None else timestamp(retry_at)
    row["settled_by"] = after.settled_by
    row["redrives"] = after.redrives
    waiting = after.waiting if after.status in (Status.PENDING, Status.RETRY_SCHEDULED) else None
    row["waiting"] = waiting
    since = after.waiting_since if waiting is not None else None
    row["waiting_since"] = None if since is None else timestamp(since)
    if after.status is not before.status:
        if after.status is Status.CONFIRMED:
            row["confirmed_at"] = at
        elif after.status is Status.FAILED:
            row["failed_at"] = at


def _operator_action(event: OperatorEvent, refusal: str | None, at: str) -> Row:
    resolved = isinstance(event, DeliveryResolved)
    return {
        "event_id": str(event.event_id),
        "idempotency_key": event.idempotency_key,
        "run_id": event.run_id,
        "action": "resolve" if resolved else "redrive",
        "outcome": event.outcome if isinstance(event, DeliveryResolved) else None,
        "operator": event.operator,
        "reason": event.reason,
        "scope": event.scope,
        "receiver_id": event.receiver_id if isinstance(event, DeliveryResolved) else None,
        "seen_status": event.seen_status,
        "result": "applied" if refusal is None else "refused",
        "refusal": refusal,
        "occurred_at": at,
    }


def _requested(batch: Batch, event: DeliveryRequested, at: str) -> None:
    key = event.idempotency_key
    state = fold_delivery(None, event)
    assert state is not None
    batch.states[key] = state
    deadline = timestamp(event.occurred_at + timedelta(seconds=event.slo_seconds))
    batch.deliveries[key] = {
        "idempotency_key": key,
        "run_id": event.run_id,
        "event_type": event.event_type,
        "channel": event.channel,
        "recipient": event.recipient,
        "payload_hash": event.payload_hash,
        "slo_seconds": event.slo_seconds,
        "slo_deadline": deadline,
        "status": _PUBLIC[state.status],
        "attempts": 0,
        "fencing_token": 0,
        "provider_message_id": None,
        "last_error_class": None,
        "reconciliation": None,
        "next_attempt_at": None,
        "requests": 1,
        "confirmed_at": None,
        "failed_at": None,
        "created_at": at,
        "updated_at": at,
        "state": "",  # written from batch.states when the batch is stored
        "settled_by": None,
        "redrives": 0,
        "waiting": None,
        "waiting_since": None,
        "agent": event.producer,
    }
    batch.dirty_deliveries.add(key)


AttemptEvent = (
    DeliveryClaimed
    | DeliverySent
    | DeliveryConfirmed
    | DeliveryNotSent
    | DeliveryUnknown
    | DeliveryReconciled
    | DeliveryRetryScheduled
)


def _attempt_row(batch: Batch, delivery: Row, attempt: int, at: str) -> Row:
    ident = (delivery["idempotency_key"], attempt)
    row = batch.attempts.get(ident)
    if row is None:
        row = {
            "idempotency_key": delivery["idempotency_key"],
            "attempt": attempt,
            "run_id": delivery["run_id"],
            "channel": delivery["channel"],
            "outcome": "CLAIMED",
            "worker_id": None,
            "fencing_token": None,
            "claimed_at": None,
            "lease_expires_at": None,
            "sent_at": None,
            "http_status": None,
            "provider_message_id": None,
            "error_class": None,
            "reason": None,
            "unknown_at": None,
            "reconciliation": None,
            "reconciled_at": None,
            "retry_scheduled_at": None,
            "retry_at": None,
            "confirmed_at": None,
            "failed_at": None,
            "finished_at": None,
            "created_at": at,
            "updated_at": at,
        }
        batch.attempts[ident] = row
    row["updated_at"] = at
    batch.dirty_attempts.add(ident)
    return row


def _attempt_outcome(attempt: Row, outcome: str) -> None:
    # An attempt the provider confirmed stays confirmed, whatever arrives late.
    if attempt["outcome"] != "CONFIRMED":
        attempt["outcome"] = outcome


def _attempt_event(batch: Batch, row: Row, event: AttemptEvent, at: str) -> None:
    """Record what the attempt reported on its own row, current or superseded."""
    attempt = _attempt_row(batch, row, event.attempt, at)
    if isinstance(event, DeliveryClaimed):
        attempt.update(worker_id=event.worker_id, fencing_token=event.fencing_token, claimed_at=at)
        attempt["lease_expires_at"] = timestamp(event.lease_expires_at)
    elif isinstance(event, DeliverySent):
        _attempt_outcome(attempt, "SENT")
        attempt.update(sent_at=at, http_status=event.http_status, fencing_token=event.fencing_token)
        attempt["worker_id"] = attempt["worker_id"] or event.worker_id
        _provider_id(attempt, event.provider_message_id)
    elif isinstance(event, DeliveryConfirmed):
        _attempt_outcome(attempt, "CONFIRMED")
        attempt["confirmed_at"] = attempt["confirmed_at"] or at
        attempt["finished_at"] = attempt["finished_at"] or at
        _provider_id(attempt, event.provider_message_id)
    elif isinstance(event, DeliveryNotSent):
        _attempt_outcome(attempt, "NOT_SENT")
        attempt.update(error_class=event.error_class, reason=event.reason)
        attempt["finished_at"] = attempt["finished_at"] or at
    elif isinstance(event, DeliveryUnknown):
        _attempt_outcome(attempt, "UNKNOWN")
        attempt.update(error_class=event.error_class, reason=event.reason, unknown_at=at)
        attempt["finished_at"] = attempt["finished_at"] or at
    elif isinstance(event, DeliveryReconciled):
        attempt.update(reconciliation=event.outcome, reconciled_at=at)
        _provider_id(attempt, event.provider_message_id)
    elif isinstance(event, DeliveryRetryScheduled):
        _attempt_outcome(attempt, "RETRY")
        attempt.update(error_class=event.error_class, retry_scheduled_at=at)
        attempt["retry_at"] = timestamp(event.retry_at)
        attempt["finished_at"] = attempt["finished_at"] or at


def _provider_id(attempt: Row, provider_message_id: str | None) -> None:
    if provider_message_id is not None:
        attempt["provider_message_id"] = provider_message_id
