"""A delivery's state, and the pure fold that applies one event to it.

``apply`` has no I/O and no clock: the state after a sequence of events depends only on
those events. It is also safe under at-least-once input: an event already applied
(same ``event_id``) changes nothing, and outcome events carrying a stale fencing token
are ignored, because outcomes come from outside the processor's transaction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from events.base import Event
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
from events.operator import DeliveryRedriveRequested, DeliveryResolved, OperatorEvent
from events.outcomes import NOT_FOUND_REQUIRED, ErrorClass, LookupOutcome
from events.waiting import DeliveryHeld, WaitReason

# How many applied event ids a state remembers for dedupe. A delivery sees a handful of
# events per attempt; redelivered input is recent, so a bounded window suffices.
SEEN_WINDOW = 64


class Status(enum.StrEnum):
    """Where a delivery stands. CLAIMED and RETRY_SCHEDULED are PENDING to the outside."""

    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    SENT = "SENT"
    UNKNOWN = "UNKNOWN"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        """CONFIRMED and FAILED never change again."""
        return self in (Status.CONFIRMED, Status.FAILED)

    @property
    def public(self) -> str:
        """The delivery state operators see (ARCHITECTURE.md)."""
        if self in (Status.CLAIMED, Status.RETRY_SCHEDULED):
            return "PENDING"
        return self.value


@dataclass(frozen=True)
class DeliveryState:
    """Everything the processor knows about one logical delivery."""

    idempotency_key: str
    run_id: str
    event_type: str
    channel: str
    recipient: str
    payload: JsonValue
    payload_hash: str
    slo_seconds: int
    requested_at: datetime
    request_event_id: str
    status: Status = Status.PENDING
    attempt: int = 0
    fencing_token: int = 0
    claim_worker: str | None = None
    lease_expires_at: datetime | None = None
    retry_at: datetime | None = None
    last_error_class: ErrorClass | None = None
    last_reason: str | None = None
    provider_message_id: str | None = None
    provider_status: str | None = None
    # The last lookup's outcome for the current attempt: the evidence a retry needs.
    reconciled: LookupOutcome | None = None
    lookups: int = 0
    # "Not found" answers for the current attempt: evidence only once NOT_FOUND_REQUIRED.
    not_found: int = 0
    check_at: datetime | None = None
    updated_at: datetime | None = None
    duplicates: int = 0
    conflicts: int = 0
    # Operator actions (events/operator.py): who settled it, if an operator did; how many
    # redrives; and where the retry policy counts from since the last one (attempts after
    # ``attempt_base``, age since ``policy_from``; the request's time when None).
    settled_by: str | None = None
    redrives: int = 0
    attempt_base: int = 0
    policy_from: datetime | None = None
    # A redrive asked for a lookup now, whatever the lookups before it concluded.
    fresh_lookup: bool = False
    # Held back before its next claim (events/waiting.py), since when; the claim ends it.
    waiting: WaitReason | None = None
    waiting_since: datetime | None = None
    # Who asked for it: the DeliveryRequested's producer (the agent, for send budgets).
    agent: str | None = None
    seen: tuple[str, ...] = field(default_factory=tuple)
    # The W3C trace context the request arrived with (its record's ``traceparent`` header,
    # set by the worker, not by the fold): the parent of the worker's spans for this
    # delivery, for as long as it lives (a timer's lookup has only the state). A hint for
    # traces, no fact of the delivery: states that differ only here are equal.
    traceparent: str | None = field(default=None, compare=False)


def apply(state: DeliveryState | None, event: Event) -> DeliveryState | None:
    """Fold one event into the state. Unknown, stale or repeated events change nothing."""
    if not isinstance(event, DeliveryEvent):
        return state
    if state is None:
        return _new(event) if isinstance(event, DeliveryRequested) else None
    event_id = str(event.event_id)
    if event_id in state.seen or event.idempotency_key != state.idempotency_key:
        return state
    seen = (*state.seen, event_id)[-SEEN_WINDOW:]
    changed = _transition(state, event)
    if changed is None:
        # Remember ignored events too: redelivered later, after the state has moved on,
        # they must not apply where they did not apply the first time.
        return _evolve(state, seen=seen)
    # ``changed`` is a fresh copy made by this call: finish it in place, not copy it again.
    changed.__dict__.update(seen=seen, updated_at=event.occurred_at)
    if changed.waiting is not None and changed.status not in _MAY_WAIT:
        changed.__dict__.update(waiting=None, waiting_since=None)  # a wait ends with PENDING
    return changed


_MAY_WAIT = frozenset({Status.PENDING, Status.RETRY_SCHEDULED})


def _evolve(state: DeliveryState, **changes: Any) -> DeliveryState:
    """``dataclasses.replace`` without re-running ``__init__``: the fold makes one or two of
    these per event, and on a 29-field state ``replace`` was most of the fold's cost."""
    evolved = object.__new__(DeliveryState)
    evolved.__dict__.update(state.__dict__)
    evolved.__dict__.update(changes)
    return evolved


def _new(event: DeliveryRequested) -> DeliveryState:
    return DeliveryState(
        idempotency_key=event.idempotency_key,
        run_id=event.run_id,
        event_type=event.event_type,
        channel=event.channel,
        recipient=event.recipient,
        payload=event.payload,
        payload_hash=event.payload_hash,
        slo_seconds=event.slo_seconds,
        requested_at=event.occurred_at,
        request_event_id=str(event.event_id),
        updated_at=event.occurred_at,
        agent=event.producer,
        seen=(str(event.event_id),),
    )


def _transition(s: DeliveryState, e: DeliveryEvent) -> DeliveryState | None:
    """The new state, or None when the event does not apply to this state."""
    if isinstance(e, DuplicateDeliveryRequest):
        if e.outcome == "conflict":
            return _evolve(s, conflicts=s.conflicts + 1)
        return _evolve(s, duplicates=s.duplicates + 1)
    if isinstance(e, DeliveryConfirmed):
        return _confirmed(s, e)
    if isinstance(e, OperatorEvent):
        return _operator(s, e)
    if s.status.terminal or isinstance(e, DeliveryRequested):
        return None
    if isinstance(e, DeliveryClaimed):
        # A claim is live only if it is the next attempt under a strictly newer token.
        if s.status not in (Status.PENDING, Status.RETRY_SCHEDULED):
            return None
        if e.fencing_token <= s.fencing_token or e.attempt != s.attempt + 1:
            return None
        return _evolve(
            s,
            status=Status.CLAIMED,
            attempt=e.attempt,
            fencing_token=e.fencing_token,
            claim_worker=e.worker_id,
            lease_expires_at=e.lease_expires_at,
            waiting=None,
            waiting_since=None,
            retry_at=None,
            reconciled=None,
            lookups=0,
            not_found=0,
            check_at=None,
        )
    if isinstance(e, DeliveryFailed):
        # Final only as the outcome of the current attempt; out of SENT only when the
        # provider itself reports the message failed, out of UNKNOWN only with a lookup's
        # evidence that nothing was accepted (or that the provider failed it).
        if e.attempts != s.attempt:
            return None
        if s.status is Status.PENDING and s.policy_from is not None and s.attempt_base == s.attempt:
            return None  # an operator's new attempt: the old attempt's late word is moot
        if s.status is Status.SENT and s.reconciled != LookupOutcome.FAILED:
            return None
        if s.status is Status.UNKNOWN and not (
            nothing_accepted(s) or s.reconciled == LookupOutcome.FAILED
        ):
            return None
        return _evolve(
            s,
            status=Status.FAILED,
            last_error_class=e.error_class,
            last_reason=e.reason,
            check_at=None,
            retry_at=None,
        )
    if isinstance(e, DeliveryRetryScheduled):
        return _retry(s, e)
    if isinstance(e, DeliveryHeld):
        # Only before a claim: a held delivery makes no attempt.
        if s.status not in (Status.PENDING, Status.RETRY_SCHEDULED) or s.waiting == e.reason:
            return None
        return _evolve(s, waiting=e.reason, waiting_since=e.occurred_at)
    if e.fencing_token != s.fencing_token:  # type: ignore[attr-defined]
        return None  # an outcome of an attempt that is no longer current
    if isinstance(e, DeliverySent):
        if s.status not in (Status.CLAIMED, Status.UNKNOWN):
            return None
        return _evolve(
            s,
            status=Status.SENT,
            provider_message_id=e.provider_message_id,
            provider_status=e.provider_status,
            lease_expires_at=None,
            check_at=None,
            lookups=0,
            reconciled=None,
        )
    if isinstance(e, DeliveryNotSent):
        # Only the claim's holder sends under its token, so its word that nothing left
        # settles the attempt, even after its lease expired into UNKNOWN.
        if s.status not in (Status.CLAIMED, Status.UNKNOWN) or e.worker_id != s.claim_worker:
            return None  # another process's word says nothing about what the holder sent
        return _evolve(
            s,
            status=Status.PENDING,
            last_error_class=e.error_class,
            last_reason=e.reason,
            lease_expires_at=None,
            reconciled=None,
            lookups=0,
            not_found=0,
            check_at=None,
        )
    if isinstance(e, DeliveryUnknown):
        # Out of CLAIMED (timeout, crash), or out of SENT when polling gave up: never
        # silent, an operator sees it.
        if s.status not in (Status.CLAIMED, Status.SENT):
            return None
        if s.status is Status.SENT and e.error_class != ErrorClass.SENT_UNCONFIRMED:
            return None
        return _evolve(
            s,
            status=Status.UNKNOWN,
            last_error_class=e.error_class,
            last_reason=e.reason,
            lease_expires_at=None,
            reconciled=None,
            lookups=0,
            not_found=0,
            check_at=e.occurred_at,
        )
    if isinstance(e, DeliveryReconciled):
        return _reconciled(s, e)
    return None


def _confirmed(s: DeliveryState, e: DeliveryConfirmed) -> DeliveryState | None:
    # Any attempt's authoritative confirmation settles the logical event: the receiver
    # identifies it by the key, not by the attempt. It outranks FAILED too: a superseded
    # attempt's late confirmation proves the event arrived, whatever the newer attempt got.
    if s.status is Status.CONFIRMED or e.fencing_token > s.fencing_token:
        return None
    return _evolve(
        s,
        status=Status.CONFIRMED,
        provider_message_id=e.provider_message_id or s.provider_message_id,
        last_reason=e.evidence,
        check_at=None,
        lease_expires_at=None,
        retry_at=None,
    )


def nothing_accepted(s: DeliveryState) -> bool:
    """The recorded evidence that the current attempt was not accepted: "not found",
    repeated; or no lookup at all (a retry then also needs the endpoint's declared
    dedupe rule, which the decisions check and name in the event)."""
    if s.reconciled == LookupOutcome.NOT_FOUND:
        return s.not_found >= NOT_FOUND_REQUIRED
    return s.reconciled == LookupOutcome.UNSUPPORTED


def lookup_turn(s: DeliveryState) -> tuple[int, Status, int]:
    """Which lookup ``s`` waits for: the attempt's token, the status, and how many lookups
    the fold recorded since the status began (a lookup's answer, read back, moves it on;
    the polls of a SENT that an UNKNOWN's lookup found count from 0 again). States with
    the same turn ask the same question: asking it again would repeat a lookup."""
    return (s.fencing_token, s.status, s.lookups)


def _reconciled(s: DeliveryState, e: DeliveryReconciled) -> DeliveryState | None:
    if s.status not in (Status.UNKNOWN, Status.SENT):
        return None
    not_found = s.not_found + 1 if e.outcome == LookupOutcome.NOT_FOUND else 0
    updated = _evolve(
        s,
        reconciled=e.outcome,
        lookups=s.lookups + 1,
        not_found=not_found,
        last_reason=e.evidence,
        provider_status=e.provider_status or s.provider_status,
        fresh_lookup=False,
    )
    if e.outcome == LookupOutcome.STUCK and s.status is Status.UNKNOWN:
        # The receiver's handler died mid-processing and may not be re-run: an operator's.
        return _evolve(updated, last_error_class=ErrorClass.RECEIVER_STUCK)
    if e.outcome == LookupOutcome.FOUND and s.status is Status.UNKNOWN:
        # The provider has it but has not delivered yet: it left the system.
        return _evolve(
            updated,
            status=Status.SENT,
            provider_message_id=e.provider_message_id,
            provider_status=e.provider_status,
            lookups=0,
        )
    return updated


def _retry(s: DeliveryState, e: DeliveryRetryScheduled) -> DeliveryState | None:
    if e.attempt != s.attempt or e.next_attempt != s.attempt + 1:
        return None
    if s.status is Status.UNKNOWN and not nothing_accepted(s):
        return None  # never out of UNKNOWN without the lookup's evidence
    if s.status not in (Status.CLAIMED, Status.UNKNOWN):
        return None
    return _evolve(
        s,
        status=Status.RETRY_SCHEDULED,
        retry_at=e.retry_at,
        last_error_class=e.error_class,
        last_reason=e.safety,
        lease_expires_at=None,
        check_at=None,
    )


def operator_refusal(s: DeliveryState, e: OperatorEvent) -> str | None:
    """Why an operator's action does not apply to ``s`` (None: it applies). The fold
    ignores a refused action; the projection records it with this reason, and the CLI and
    the dashboard check it before they append."""
    what = "resolve" if isinstance(e, DeliveryResolved) else "redrive"
    if s.status is Status.CONFIRMED:
        return f"{what}: the delivery is CONFIRMED, which is final"
    if isinstance(e, DeliveryResolved):
        if s.status is Status.SENT and not _past_slo(s, e):
            return (
                f"{what}: SENT within its SLO: the provider may still confirm it; resolve it "
                "once its SLO has passed"
            )
        if s.status not in (Status.UNKNOWN, Status.SENT):
            return f"{what} applies to UNKNOWN (and SENT past its SLO), not {s.status.public}"
    elif s.status not in (Status.FAILED, Status.UNKNOWN):
        return f"{what} applies to FAILED and UNKNOWN, not {s.status.public} (already under way)"
    if e.fencing_token != s.fencing_token or e.seen_status != s.status.value:
        return (
            f"{what}: stale: issued for {e.seen_status} under fencing token {e.fencing_token}, "
            f"the delivery is now {s.status.public} under token {s.fencing_token}"
        )
    unanswerable = s.reconciled in (LookupOutcome.UNSUPPORTED, LookupOutcome.STUCK)
    if isinstance(e, DeliveryRedriveRequested) and s.status is Status.UNKNOWN and unanswerable:
        answer = "has no lookup" if s.reconciled == LookupOutcome.UNSUPPORTED else "says stuck"
        return (
            f"{what}: no lookup can settle this UNKNOWN (the receiver {answer}): settle it "
            "with 'ledger resolve' and the receiver's evidence"
        )
    return None


def _past_slo(s: DeliveryState, e: OperatorEvent) -> bool:
    return (e.occurred_at - s.requested_at).total_seconds() >= s.slo_seconds


def _operator(s: DeliveryState, e: OperatorEvent) -> DeliveryState | None:
    if operator_refusal(s, e) is not None:
        return None
    said = f"{e.operator}: {e.reason}"
    if isinstance(e, DeliveryResolved):
        if e.outcome == "delivered":
            return _evolve(
                s,
                status=Status.CONFIRMED,
                settled_by=e.operator,
                provider_message_id=e.receiver_id or s.provider_message_id,
                last_reason=f"settled as delivered by operator {said}",
                check_at=None,
                lease_expires_at=None,
                retry_at=None,
            )
        if e.outcome == "abandoned":
            return _evolve(
                s,
                status=Status.FAILED,
                settled_by=e.operator,
                last_error_class=ErrorClass.ABANDONED_BY_OPERATOR,
                last_reason=f"abandoned by operator {said}",
                check_at=None,
                lease_expires_at=None,
                retry_at=None,
            )
        # not_delivered: the operator's evidence that nothing arrived; a new attempt.
        return _again(s, e, f"not delivered, says operator {said}")
    if s.status is Status.FAILED:
        return _again(s, e, f"redriven by operator {said}")
    # A redriven UNKNOWN: reconciled afresh, from a lookup now.
    return _evolve(
        s,
        redrives=s.redrives + 1,
        attempt_base=s.attempt,
        policy_from=e.occurred_at,
        reconciled=None,
        lookups=0,
        not_found=0,
        check_at=e.occurred_at,
        fresh_lookup=True,
        last_reason=f"reconciliation asked by operator {said}",
    )


def _again(s: DeliveryState, e: OperatorEvent, reason: str) -> DeliveryState:
    """PENDING: the next claim makes a new attempt under a new fencing token, same key,
    with the retry policy counted afresh from this action."""
    return _evolve(
        s,
        status=Status.PENDING,
        redrives=s.redrives + (1 if isinstance(e, DeliveryRedriveRequested) else 0),
        attempt_base=s.attempt,
        policy_from=e.occurred_at,
        last_reason=reason,
        lease_expires_at=None,
        retry_at=None,
        reconciled=None,
        lookups=0,
        not_found=0,
        check_at=None,
        fresh_lookup=False,
        waiting=None,
        waiting_since=None,
    )
