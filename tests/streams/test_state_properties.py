"""Hypothesis properties of the delivery fold (events/delivery_state.py): the invariants that make
single-claim delivery safe hold for ANY sequence of events, including stale, reordered and
redelivered ones."""

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
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
from events.delivery_state import DeliveryState, Status, apply
from tests.fixtures.core import applied

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


@st.composite
def delivery_event(draw: Any) -> Event:
    kind = draw(
        st.sampled_from(
            ["claim", "sent", "confirmed", "unknown", "reconciled", "retry", "failed", "dup"]
        )
    )
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
            outcome=draw(st.sampled_from(["found", "not_found", "unsupported", "lookup_error"])),
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


histories = st.lists(delivery_event(), max_size=40).map(lambda rest: [REQ, *rest])


def fold(events: list[Event]) -> list[DeliveryState]:
    states: list[DeliveryState] = []
    state: DeliveryState | None = None
    for event in events:
        state = apply(state, event)
        assert state is not None
        states.append(state)
    return states


@settings(max_examples=400, deadline=None)
@given(histories)
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
@given(histories)
def test_terminal_states_stay_terminal(events: list[Event]) -> None:
    states = fold(events)
    for before, after in itertools.pairwise(states):
        if before.status is Status.CONFIRMED:
            assert after.status is Status.CONFIRMED
        if before.status is Status.FAILED:
            # Only an authoritative confirmation (a superseded attempt's, arriving late)
            # outranks FAILED: it proves the event arrived.
            assert after.status in (Status.FAILED, Status.CONFIRMED)


@settings(max_examples=300, deadline=None)
@given(histories, st.data())
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
