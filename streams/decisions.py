"""Pure decisions: given a delivery's state and what just happened, which events to append.

No I/O and no clock: ``now`` is an argument (the processing time the edge passes in), so
every decision is reproducible in tests. Decisions only *propose* events; ``apply`` in
events/delivery_state.py accepts or ignores them when they are read back from the log.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from events.base import Event
from events.channels import DedupeRule
from events.delivery import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryFailed,
    DeliveryNotSent,
    DeliveryReconciled,
    DeliveryRequested,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
)
from events.delivery_state import DeliveryState, Status, apply, nothing_accepted
from events.outcomes import NOT_PROCESSED, ErrorClass, LookupOutcome
from events.payload_hashes import comparable
from events.waiting import DeliveryHeld, WaitReason
from streams.channels.base import LookupResult, SendOutcome, SendResult


class RetryRules(Protocol):
    """What the decisions need from a channel's retry policy (events/retry_policy.py)."""

    def delay_s(self, key: str, attempt: int, retry_after_s: float | None = None) -> float:
        """Backoff before the attempt after ``attempt`` (deterministic jitter)."""
        ...

    def exhausted(self, attempt: int, first_requested_at: datetime, now: datetime) -> bool:
        """True when no further attempt may be made."""
        ...


@dataclass(frozen=True, kw_only=True)
class Context:
    """The worker-specific inputs of decisions (settings resolved, channels consulted)."""

    worker_id: str
    producer: str
    # (channel, recipient) -> the retry policy of this delivery: its registered endpoint's
    # where the registry sets one, else the environment's for the channel
    # (streams/retry.py). An input like any other: the decision reads no registry.
    rules: Callable[[str, str], RetryRules]
    # (channel, recipient) -> the dedupe rule this recipient's endpoint declares, if any.
    dedupe_rule: Callable[[str, str], DedupeRule | None]
    # (channel, recipient) -> seconds after an UNKNOWN before the first lookup.
    settle_s: Callable[[str, str], float]
    lease_s: float
    claim_grace_s: float
    lookup_confirm_spacing_s: float
    lookup_backoff_s: float
    lookup_backoff_max_s: float
    max_lookups: int
    max_sent_polls: int


def claim(state: DeliveryState, now: datetime, ctx: Context) -> DeliveryClaimed:
    """The next attempt's claim, under a strictly newer fencing token."""
    return DeliveryClaimed(
        idempotency_key=state.idempotency_key,
        run_id=state.run_id,
        producer=ctx.producer,
        attempt=state.attempt + 1,
        fencing_token=state.fencing_token + 1,
        worker_id=ctx.worker_id,
        lease_expires_at=now + timedelta(seconds=ctx.lease_s),
        occurred_at=now,
    )


def held(
    state: DeliveryState,
    reason: WaitReason,
    detail: str,
    recheck_at: datetime | None,
    now: datetime,
    ctx: Context,
) -> DeliveryHeld:
    """The record that ``state`` waits for ``reason`` before its claim."""
    return DeliveryHeld(
        **_common(state, ctx, now),
        reason=reason,
        detail=detail,
        recheck_at=recheck_at,
    )


def on_request(
    before: DeliveryState | None,
    event: DeliveryRequested,
    after: DeliveryState | None,
    now: datetime,
    ctx: Context,
) -> list[Event]:
    """A new delivery is claimed at once; a repeated request is recorded as a duplicate."""
    if before is None and after is not None:
        return [claim(after, now, ctx)]
    if before is None or str(event.event_id) in before.seen:
        return []
    # Under one hash scheme: a request stored before the RFC 8785 hashes and repeated after
    # them is compared by what its payload is, not by how it was hashed.
    again, original = comparable(
        (event.payload_hash, event.payload), (before.payload_hash, before.payload)
    )
    return [
        DuplicateDeliveryRequest(
            idempotency_key=before.idempotency_key,
            run_id=before.run_id,
            producer=ctx.producer,
            duplicate_event_id=event.event_id,
            payload_hash=again,
            original_payload_hash=original,
            outcome="deduplicated" if again == original else "conflict",
            occurred_at=now,
        )
    ]


def after_send(
    state: DeliveryState, token: int, result: SendResult, now: datetime, ctx: Context
) -> list[Event]:
    """The outcome events of one send attempt, classified."""
    common = _common(state, ctx, now)
    attempt = {"attempt": state.attempt, "fencing_token": token}
    error = result.error_class or ErrorClass.UNCLASSIFIED
    match result.outcome:
        case SendOutcome.CONFIRMED:
            return [
                DeliveryConfirmed(
                    **common,
                    **attempt,
                    source="send",
                    provider_message_id=result.provider_message_id,
                    evidence=result.evidence,
                )
            ]
        case SendOutcome.SENT:
            return [
                DeliverySent(
                    **common,
                    **attempt,
                    worker_id=ctx.worker_id,
                    provider_message_id=result.provider_message_id,
                    provider_status=result.provider_status,
                    http_status=result.http_status,
                )
            ]
        case SendOutcome.UNKNOWN:
            return [DeliveryUnknown(**common, **attempt, error_class=error, reason=result.evidence)]
        case SendOutcome.REJECTED:
            return [
                DeliveryFailed(
                    **common, attempts=state.attempt, error_class=error, reason=result.evidence
                )
            ]
        case SendOutcome.NOT_SENT if result.error_class is ErrorClass.FENCED:
            return [
                DeliveryNotSent(
                    **common,
                    **attempt,
                    worker_id=ctx.worker_id,
                    error_class=error,
                    reason=result.evidence,
                )
            ]
        case SendOutcome.NOT_SENT:
            safety = f"nothing was written ({error}): {result.evidence}"
            return [retry_or_fail(state, error, safety, now, ctx)]
        case SendOutcome.TRANSIENT if result.error_class in NOT_PROCESSED:
            safety = f"the receiver did not process it ({error}): {result.evidence}"
            return [retry_or_fail(state, error, safety, now, ctx, result.retry_after_s)]
        case _:
            # 5xx / 409: the receiver may have accepted before failing. Look up first.
            reason = f"{result.evidence}; it may have been accepted: lookup before retry"
            return [DeliveryUnknown(**common, **attempt, error_class=error, reason=reason)]


def released(claim: DeliveryClaimed, reason: str, now: datetime, ctx: Context) -> DeliveryNotSent:
    """A claim this worker appended and will never read back (it stops, or the claim's
    partition moved away): nothing was sent under it, and this worker is its holder."""
    return DeliveryNotSent(
        idempotency_key=claim.idempotency_key,
        run_id=claim.run_id,
        producer=ctx.producer,
        occurred_at=now,
        attempt=claim.attempt,
        fencing_token=claim.fencing_token,
        worker_id=ctx.worker_id,
        error_class=ErrorClass.FENCED,
        reason=reason,
    )


def after_lookup(
    state: DeliveryState, result: LookupResult, now: datetime, ctx: Context
) -> list[Event]:
    """Record the lookup, then act on its evidence."""
    common = _common(state, ctx, now)
    attempt = {"attempt": state.attempt, "fencing_token": state.fencing_token}
    reconciled = DeliveryReconciled(
        **common,
        **attempt,
        outcome=result.outcome,
        provider_message_id=result.provider_message_id,
        provider_status=result.provider_status,
        evidence=result.evidence,
    )
    events: list[Event] = [reconciled]
    # What the fold will make of this lookup: whether its answers are evidence yet is the
    # fold's rule (``nothing_accepted``), asked here, never predicted.
    recorded = apply(state, reconciled) or state
    rule = ctx.dedupe_rule(state.channel, state.recipient)
    if result.outcome == LookupOutcome.FOUND and result.delivered:
        events.append(
            DeliveryConfirmed(
                **common,
                **attempt,
                source="reconciliation",
                provider_message_id=result.provider_message_id,
                evidence=f"lookup by idempotency key: {result.evidence}",
            )
        )
    elif result.outcome == LookupOutcome.FAILED and state.status in (Status.SENT, Status.UNKNOWN):
        events.append(
            DeliveryFailed(
                **common,
                attempts=state.attempt,
                error_class=ErrorClass.PROVIDER_FAILED,
                reason=f"the provider reports the message {result.provider_status}: "
                f"{result.evidence}",
            )
        )
    elif (
        state.status is Status.UNKNOWN
        and result.outcome == LookupOutcome.NOT_FOUND
        and nothing_accepted(recorded)
    ):
        settle = ctx.settle_s(state.channel, state.recipient)
        safety = (
            f"lookup by idempotency key found nothing {recorded.not_found} times, the first "
            f"{settle:g}s after the attempt ended: {result.evidence}"
        )
        events.append(retry_or_fail(state, _cause(state), safety, now, ctx))
    elif (
        state.status is Status.UNKNOWN
        and result.outcome == LookupOutcome.UNSUPPORTED
        and rule is not None
        and remembered(rule, state, now)
    ):
        safety = f"no lookup; a retry is safe by the dedupe rule {rule.name}: {rule.description}"
        events.append(retry_or_fail(state, _cause(state), safety, now, ctx, dedupe_rule=rule.name))
    return events


def remembered(rule: DedupeRule, state: DeliveryState, now: datetime) -> bool:
    """True while the receiver still remembers the key under ``rule``: its window counts
    from the request, which is no later than the first send carrying the key."""
    if rule.window_s is None:
        return True
    return (now - state.requested_at).total_seconds() < rule.window_s


def _cause(state: DeliveryState) -> ErrorClass:
    # Every DeliveryUnknown records why the attempt is in doubt; a state without it can
    # only come from outside the fold, and a write that may have happened is the truth.
    return state.last_error_class or ErrorClass.TIMEOUT_AFTER_WRITE


def retry_or_fail(
    state: DeliveryState,
    error_class: ErrorClass,
    safety: str,
    now: datetime,
    ctx: Context,
    retry_after_s: float | None = None,
    dedupe_rule: str | None = None,
) -> Event:
    """Schedule the next attempt, or fail when the delivery's policy (its endpoint's, else
    its channel's: ``Context.rules``) is exhausted. ``dedupe_rule`` names the receiver's
    rule when that is what makes the retry safe."""
    rules = ctx.rules(state.channel, state.recipient)
    common = _common(state, ctx, now)
    # After an operator's action the policy counts afresh: attempts since, age since.
    counted = state.attempt - state.attempt_base
    if rules.exhausted(counted, state.policy_from or state.requested_at, now):
        return DeliveryFailed(
            **common,
            attempts=state.attempt,
            error_class=error_class,
            reason=f"retries exhausted after attempt {state.attempt}: {safety}",
        )
    delay = rules.delay_s(state.idempotency_key, counted, retry_after_s)
    return DeliveryRetryScheduled(
        **common,
        attempt=state.attempt,
        next_attempt=state.attempt + 1,
        retry_at=now + timedelta(seconds=delay),
        error_class=error_class,
        safety=safety,
        dedupe_rule=dedupe_rule,
    )


def due_at(state: DeliveryState, ctx: Context) -> datetime | None:
    """When a timer must next look at this delivery (None: nothing to wait for)."""
    base = state.updated_at or state.requested_at
    match state.status:
        case Status.PENDING:
            return base + timedelta(seconds=ctx.claim_grace_s)
        case Status.RETRY_SCHEDULED:
            return state.retry_at
        case Status.CLAIMED:
            return state.lease_expires_at
        case Status.UNKNOWN:
            return _next_lookup(state, base, ctx)
        case Status.SENT:
            if state.lookups >= ctx.max_sent_polls:
                return base  # polling gives up now: UNKNOWN, for an operator to see
            return base + timedelta(seconds=_backoff(state.lookups + 1, ctx))
    return None


def _next_lookup(state: DeliveryState, base: datetime, ctx: Context) -> datetime | None:
    if state.fresh_lookup:
        # An operator's redrive: a lookup now (after the settle time), whatever came before.
        since = state.check_at or base
        return since + timedelta(seconds=ctx.settle_s(state.channel, state.recipient))
    if state.last_error_class == ErrorClass.SENT_UNCONFIRMED or state.lookups >= ctx.max_lookups:
        return None  # an operator resolves it; it stays visible as UNKNOWN
    match state.reconciled:
        case None:
            # The receiver may still be processing what the client gave up on: settle first.
            since = state.check_at or base
            return since + timedelta(seconds=ctx.settle_s(state.channel, state.recipient))
        case LookupOutcome.NOT_FOUND:
            return base + timedelta(seconds=ctx.lookup_confirm_spacing_s)
        case LookupOutcome.PROCESSING | LookupOutcome.LOOKUP_ERROR:
            return base + timedelta(seconds=_backoff(state.lookups, ctx))
    # Decided (found, failed), no lookup exists (unsupported), or the receiver's handler
    # died and may not run again (stuck): an operator's, no more lookups.
    return None


class TimerAction(enum.StrEnum):
    """What a due timer asks of the edge beyond events to append."""

    LOOKUP = "lookup"  # ask the provider about the key (the sender runs it)


def on_timer(
    state: DeliveryState, now: datetime, ctx: Context
) -> tuple[list[Event], TimerAction | None]:
    """What a due timer decides: a claim, a lease expiry, giving up on SENT, or a lookup."""
    due = due_at(state, ctx)
    if due is None or now < due:
        return [], None
    if state.status in (Status.PENDING, Status.RETRY_SCHEDULED):
        return [claim(state, now, ctx)], None
    common = _common(state, ctx, now)
    attempt = {"attempt": state.attempt, "fencing_token": state.fencing_token}
    if state.status is Status.CLAIMED:
        reason = (
            f"lease of worker {state.claim_worker} for attempt {state.attempt} expired "
            "with no outcome: the request may have left"
        )
        return [
            DeliveryUnknown(
                **common, **attempt, error_class=ErrorClass.LEASE_EXPIRED, reason=reason
            )
        ], None
    if state.status is Status.SENT and state.lookups >= ctx.max_sent_polls:
        reason = (
            f"the provider still reports {state.provider_status!r} after {state.lookups} "
            "lookups: polling gave up; it may or may not arrive, an operator must check"
        )
        return [
            DeliveryUnknown(
                **common, **attempt, error_class=ErrorClass.SENT_UNCONFIRMED, reason=reason
            )
        ], None
    return [], TimerAction.LOOKUP


def _backoff(n: int, ctx: Context) -> float:
    if n <= 0:
        return 0.0
    return float(min(ctx.lookup_backoff_s * 2 ** (n - 1), ctx.lookup_backoff_max_s))


def _common(state: DeliveryState, ctx: Context, now: datetime) -> dict[str, object]:
    return {
        "idempotency_key": state.idempotency_key,
        "run_id": state.run_id,
        "producer": ctx.producer,
        "occurred_at": now,
    }
