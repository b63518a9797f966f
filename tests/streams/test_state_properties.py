"""Hypothesis properties of the delivery fold (events/delivery_state.py): the invariants that make
single-claim delivery safe hold for ANY sequence of events, including stale, reordered and
redelivered ones."""

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event, given, settings, target
from hypothesis import strategies as st

from events.base import Event
from events.delivery import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryFailed,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
    new_delivery_requested,
)
from events.delivery_state import DeliveryState, Status, apply, operator_refusal
from events.operator import DeliveryRedriveRequested, DeliveryResolved, OperatorEvent
from events.outcomes import ErrorClass
from tests.fixtures.core import applied
from tests.fixtures.operator_events import label, operator_event

T0 = datetime(2026, 12, 1, tzinfo=UTC)
REQ = new_delivery_requested(
    run_id="run-p",
    event_type="run.succeeded",
    channel="webhook",
    recipient="http://127.0.0.1:9/h",
    payload={"n": 1},
    slo_seconds=60,
    producer="t",
    occurred_at=T0,
)
KEY = {"idempotency_key": REQ.idempotency_key, "run_id": REQ.run_id, "producer": "t"}
small = st.integers(min_value=1, max_value=4)


def at(n: int) -> datetime:
    return T0 + timedelta(seconds=n)


KINDS = ["claim", "sent", "confirmed", "unknown", "reconciled", "retry", "failed", "dup"]
# Fitted to the state reached: what may plausibly come next (so histories reach UNKNOWN
# and FAILED often, not only CONFIRMED, which is final).
NEXT_KINDS = {
    Status.PENDING: ["claim", "dup"],
    Status.RETRY_SCHEDULED: ["claim"],
    Status.CLAIMED: ["sent", "unknown", "unknown", "failed", "retry", "confirmed"],
    Status.SENT: ["reconciled", "unknown", "confirmed", "failed"],
    Status.UNKNOWN: ["reconciled", "reconciled", "retry", "failed", "sent", "confirmed"],
    Status.CONFIRMED: KINDS,
    Status.FAILED: KINDS,
}


@st.composite
def delivery_event(draw: Any, kinds: list[str] = KINDS) -> Event:
    kind = draw(st.sampled_from(kinds))
    token, attempt, t = draw(small), draw(small), at(draw(st.integers(0, 1000)))
    base = {**KEY, "occurred_at": t}
    if kind == "claim":
        return DeliveryClaimed(
            **base,
            attempt=attempt,
            fencing_token=token,
            worker_id=draw(st.sampled_from(["w1", "w2"])),
            lease_expires_at=t + timedelta(seconds=30),
        )
    if kind == "sent":
        return DeliverySent(
            **base,
            attempt=attempt,
            fencing_token=token,
            worker_id="w1",
            provider_message_id="m",
            provider_status="queued",
        )
    if kind == "confirmed":
        return DeliveryConfirmed(
            **base,
            attempt=attempt,
            fencing_token=token,
            source=draw(st.sampled_from(["send", "reconciliation"])),
            evidence="ok",
        )
    if kind == "unknown":
        return DeliveryUnknown(
            **base,
            attempt=attempt,
            fencing_token=token,
            error_class="timeout_after_write",
            reason="timeout",
        )
    if kind == "reconciled":
        return DeliveryReconciled(
            **base,
            attempt=attempt,
            fencing_token=token,
            evidence="lookup",
            outcome=draw(
                st.sampled_from(
                    ["found", "not_found", "unsupported", "lookup_error", "stuck", "failed"]
                )
            ),
        )
    if kind == "retry":
        return DeliveryRetryScheduled(
            **base,
            attempt=attempt,
            next_attempt=attempt + 1,
            retry_at=t,
            error_class="http_5xx",
            safety="s",
        )
    if kind == "failed":
        return DeliveryFailed(**base, attempts=attempt, error_class="http_4xx", reason="410")
    return DuplicateDeliveryRequest(
        **base,
        duplicate_event_id=REQ.event_id,
        payload_hash=REQ.payload_hash,
        original_payload_hash=REQ.payload_hash,
        outcome=draw(st.sampled_from(["deduplicated", "conflict"])),
    )


def _fitted(event: Event, state: DeliveryState, bump: int) -> Event:
    """``event`` made to fit ``state``: the current attempt and token (a claim: the next)."""
    # Literal updates: tests/config/test_settings.py reads every model_copy(update=...).
    if isinstance(event, DeliveryClaimed):
        token = state.fencing_token + bump
        return event.model_copy(update={"attempt": state.attempt + 1, "fencing_token": token})
    if isinstance(event, DeliveryFailed):
        return event.model_copy(update={"attempts": state.attempt})
    if isinstance(event, DeliveryRetryScheduled):
        next_attempt = state.attempt + 1
        return event.model_copy(update={"attempt": state.attempt, "next_attempt": next_attempt})
    if hasattr(event, "fencing_token"):
        token = state.fencing_token
        return event.model_copy(update={"attempt": state.attempt, "fencing_token": token})
    return event


@st.composite
def histories(draw: Any, max_size: int = 40) -> list[Event]:
    """A request, then any events: drawn blind (any token, any attempt), fitted to the
    state reached (so the histories get past a claim), or an operator's action, aimed at
    the state reached, stale, or at anything."""
    events: list[Event] = [REQ]
    state = apply(None, REQ)
    assert state is not None
    for _ in range(draw(st.integers(0, max_size))):
        how = draw(st.sampled_from(["blind", "fitted", "fitted", "fitted", "operator"]))
        if how == "operator":
            e: Event = draw(operator_event(state, at(draw(st.integers(0, 1000)))))
        else:
            e = draw(delivery_event(NEXT_KINDS[state.status] if how == "fitted" else KINDS))
            if how == "fitted":
                e = _fitted(e, state, draw(small))
        events.append(e)
        after = apply(state, e)
        assert after is not None
        state = after
    return events


def fold(events: list[Event]) -> list[DeliveryState]:
    states: list[DeliveryState] = []
    state: DeliveryState | None = None
    for e in events:
        state = apply(state, e)
        assert state is not None
        states.append(state)
    return states


@settings(max_examples=400, deadline=None)
@given(histories())
def test_claims_are_single_and_fenced(events: list[Event]) -> None:
    states = fold(events)
    last_token = 0
    for before, after in itertools.pairwise(states):
        if after.status is Status.CLAIMED and after.fencing_token != before.fencing_token:
            # A new claim only when no attempt is live, under a strictly newer token.
            assert before.status in (Status.PENDING, Status.RETRY_SCHEDULED)
            assert after.fencing_token > last_token
            assert after.attempt == before.attempt + 1
            last_token = after.fencing_token
        assert after.fencing_token >= before.fencing_token


@settings(max_examples=400, deadline=None)
@given(histories())
def test_terminal_states_stay_terminal(events: list[Event]) -> None:
    states = fold(events)
    for before, after in itertools.pairwise(states):
        if before.status is Status.CONFIRMED:
            assert after.status is Status.CONFIRMED
        if before.status is Status.FAILED:
            # Only an authoritative confirmation (a superseded attempt's, arriving late)
            # outranks FAILED: it proves the event arrived; or an operator redrives it.
            assert after.status in (Status.FAILED, Status.CONFIRMED) or (
                after.status is Status.PENDING and after.redrives == before.redrives + 1
            )


# What may differ once CONFIRMED: the duplicates counted, and the events remembered.
_BOOKKEEPING = ("duplicates", "conflicts", "seen", "updated_at")


def _settled(state: DeliveryState) -> dict[str, Any]:
    return {k: v for k, v in vars(state).items() if k not in _BOOKKEEPING}


@settings(max_examples=1000, deadline=None)
@given(histories(max_size=60))
def test_operator_actions_apply_only_where_the_table_says(events: list[Event]) -> None:
    """CONFIRMED never changes; an operator's ``delivered`` confirms, settled by them;
    ``abandoned`` fails; ``not_delivered`` and a redrive of FAILED make the next claim a
    new attempt under a strictly newer token; a redrive of UNKNOWN asks for a lookup; a
    refused action changes nothing but ``seen``."""
    states = fold(events)
    applied_actions = 0
    # After an action that asks for a new attempt: the token it was taken under.
    new_attempt_after: int | None = None
    for e, before, after in zip(events[1:], states[:-1], states[1:], strict=True):
        if before.status is Status.CONFIRMED:
            assert _settled(after) == _settled(before)
        if (
            new_attempt_after is not None
            and after.status is Status.CLAIMED
            and before.status is not Status.CLAIMED
        ):
            assert after.fencing_token > new_attempt_after
            assert after.attempt == before.attempt + 1
            event("a claim after an operator's new attempt")
            new_attempt_after = None
        if not isinstance(e, OperatorEvent):
            continue
        if str(e.event_id) in before.seen:
            assert after == before
            continue
        event(label(before, e))
        if operator_refusal(before, e) is not None:
            assert after == dataclasses.replace(before, seen=after.seen)
            assert after.seen[-1] == str(e.event_id)
            continue
        applied_actions += 1
        assert after.fencing_token == before.fencing_token  # only a claim moves the token
        if isinstance(e, DeliveryResolved) and e.outcome == "delivered":
            assert after.status is Status.CONFIRMED
            assert after.settled_by == e.operator
            assert after.provider_message_id == (e.receiver_id or before.provider_message_id)
        elif isinstance(e, DeliveryResolved) and e.outcome == "abandoned":
            assert after.status is Status.FAILED
            assert after.settled_by == e.operator
            assert after.last_error_class == ErrorClass.ABANDONED_BY_OPERATOR
        elif isinstance(e, DeliveryResolved) or before.status is Status.FAILED:
            assert after.status is Status.PENDING
            assert (after.attempt_base, after.policy_from) == (before.attempt, e.occurred_at)
            assert after.redrives == before.redrives + isinstance(e, DeliveryRedriveRequested)
            new_attempt_after = before.fencing_token
        else:
            assert before.status is after.status is Status.UNKNOWN
            assert after.fresh_lookup
            assert after.reconciled is None
            assert after.redrives == before.redrives + 1
    target(applied_actions, label="operator actions applied in one history")


@settings(max_examples=300, deadline=None)
@given(histories(), st.data())
def test_replay_and_redelivery_give_the_same_state(events: list[Event], data: Any) -> None:
    final = fold(events)[-1]
    # At-least-once input: a consumer restarting from an older offset re-delivers a suffix.
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    assert fold(events + events[cut:])[-1] == final
    # ... or repeats single events in place.
    doubled = [
        e for event in events for e in ([event, event] if data.draw(st.booleans()) else [event])
    ]
    assert fold(doubled)[-1] == final


def test_outcome_of_a_stale_token_is_ignored() -> None:
    claim1 = DeliveryClaimed(
        **KEY, attempt=1, fencing_token=1, worker_id="w1", lease_expires_at=at(30)
    )
    expired = DeliveryUnknown(
        **KEY, attempt=1, fencing_token=1, error_class="lease_expired", reason="x"
    )
    lookup = DeliveryReconciled(
        **KEY, attempt=1, fencing_token=1, outcome="not_found", evidence="404"
    )
    retry = DeliveryRetryScheduled(
        **KEY,
        attempt=1,
        next_attempt=2,
        retry_at=at(40),
        error_class="lease_expired",
        safety="not found",
    )
    claim2 = DeliveryClaimed(
        **KEY, attempt=2, fencing_token=2, worker_id="w2", lease_expires_at=at(70)
    )
    late_unknown = DeliveryUnknown(
        **KEY, attempt=1, fencing_token=1, error_class="timeout_after_write", reason="late"
    )
    lookup2 = DeliveryReconciled(
        **KEY, attempt=1, fencing_token=1, outcome="not_found", evidence="404 again"
    )
    # One "not found" is no evidence yet: the retry is ignored until the second.
    assert fold([REQ, claim1, expired, lookup, retry])[-1].status is Status.UNKNOWN
    states = fold([REQ, claim1, expired, lookup, lookup2, retry, claim2, late_unknown])
    assert states[-1].status is Status.CLAIMED
    assert states[-1].fencing_token == 2
    assert states[-1].claim_worker == "w2"
    # ...but a late confirmation of attempt 1 settles the logical event.
    late_ok = DeliveryConfirmed(**KEY, attempt=1, fencing_token=1, source="send", evidence="200")
    assert applied(states[-1], late_ok).status is Status.CONFIRMED


def test_unknown_without_lookup_evidence_refuses_retry() -> None:
    claim1 = DeliveryClaimed(
        **KEY, attempt=1, fencing_token=1, worker_id="w1", lease_expires_at=at(30)
    )
    unknown = DeliveryUnknown(
        **KEY, attempt=1, fencing_token=1, error_class="timeout_after_write", reason="t"
    )
    blind = DeliveryRetryScheduled(
        **KEY,
        attempt=1,
        next_attempt=2,
        retry_at=at(5),
        error_class="timeout_after_write",
        safety="none",
    )
    state = fold([REQ, claim1, unknown, blind])[-1]
    assert state.status is Status.UNKNOWN
    failed = DeliveryFailed(**KEY, attempts=1, error_class="timeout_after_write", reason="give up")
    assert applied(state, failed).status is Status.UNKNOWN
