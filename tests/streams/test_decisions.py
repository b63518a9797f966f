"""The one classifier: what each send and lookup result makes the worker append, and when."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from events.base import Event
from events.channels import DedupeRule
from events.delivery import (
    DeliveryConfirmed,
    DeliveryFailed,
    DeliveryNotSent,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
)
from events.delivery_state import DeliveryState, Status, apply
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.base import LookupResult, SendOutcome, SendResult
from streams.decisions import after_lookup, after_send, claim, due_at, on_timer
from tests.fixtures.core import T0, applied, core_context, requested

CTX = core_context(settle_s=15.0)


def claimed() -> DeliveryState:
    state = apply(None, requested())
    assert state is not None
    after = apply(state, claim(state, T0, CTX))
    assert after is not None
    assert after.status is Status.CLAIMED
    return after


def unknown(reconciled: LookupOutcome | None = None, not_found: int = 0) -> DeliveryState:
    return replace(
        claimed(),
        status=Status.UNKNOWN,
        last_error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
        check_at=T0,
        updated_at=T0,
        reconciled=reconciled,
        not_found=not_found,
        lookups=not_found,
    )


@pytest.mark.parametrize(
    ("outcome", "error", "expected"),
    [
        (SendOutcome.CONFIRMED, None, DeliveryConfirmed),
        (SendOutcome.SENT, None, DeliverySent),
        (SendOutcome.NOT_SENT, ErrorClass.CONNECT_REFUSED, DeliveryRetryScheduled),
        (SendOutcome.NOT_SENT, ErrorClass.DNS_FAILURE, DeliveryRetryScheduled),
        (SendOutcome.NOT_SENT, ErrorClass.CONNECT_TIMEOUT, DeliveryRetryScheduled),
        (SendOutcome.NOT_SENT, ErrorClass.DEADLINE_BEFORE_WRITE, DeliveryRetryScheduled),
        (SendOutcome.NOT_SENT, ErrorClass.FENCED, DeliveryNotSent),
        (SendOutcome.UNKNOWN, ErrorClass.TIMEOUT_AFTER_WRITE, DeliveryUnknown),
        (SendOutcome.UNKNOWN, ErrorClass.RESET_AFTER_WRITE, DeliveryUnknown),
        (SendOutcome.TRANSIENT, ErrorClass.HTTP_429, DeliveryRetryScheduled),
        (SendOutcome.TRANSIENT, ErrorClass.HTTP_408, DeliveryRetryScheduled),
        (SendOutcome.TRANSIENT, ErrorClass.HTTP_425, DeliveryRetryScheduled),
        (SendOutcome.TRANSIENT, ErrorClass.HTTP_409, DeliveryUnknown),
        (SendOutcome.TRANSIENT, ErrorClass.HTTP_5XX, DeliveryUnknown),
        (SendOutcome.REJECTED, ErrorClass.HTTP_4XX, DeliveryFailed),
        (SendOutcome.REJECTED, ErrorClass.PROVIDER_FAILED, DeliveryFailed),
    ],
)
def test_a_send_result_becomes_one_event(
    outcome: SendOutcome, error: ErrorClass | None, expected: type
) -> None:
    state = claimed()
    events = after_send(state, state.fencing_token, SendResult(outcome, "evidence", error), T0, CTX)
    assert [type(e) for e in events] == [expected]
    # What the worker appends is what its own fold accepts.
    assert apply(state, events[0]) != state


def classes(*kinds: type[Event]) -> list[type[Event]]:
    """Event classes as a list typed as such (mypy joins two of them into a constructor)."""
    return list(kinds)


def _lookup(
    state: DeliveryState,
    outcome: LookupOutcome,
    *,
    delivered: bool = False,
    provider_status: str | None = None,
) -> list[type]:
    result = LookupResult(
        outcome, "lookup evidence", delivered=delivered, provider_status=provider_status
    )
    return [type(e) for e in after_lookup(state, result, T0, CTX)]


def test_one_not_found_is_not_evidence_two_are() -> None:
    assert _lookup(unknown(), LookupOutcome.NOT_FOUND) == [DeliveryReconciled]
    assert _lookup(unknown(LookupOutcome.NOT_FOUND, 1), LookupOutcome.NOT_FOUND) == classes(
        DeliveryReconciled,
        DeliveryRetryScheduled,
    )


def test_found_processing_failed_and_unsupported() -> None:
    assert _lookup(unknown(), LookupOutcome.FOUND, delivered=True) == [
        DeliveryReconciled,
        DeliveryConfirmed,
    ]
    assert _lookup(unknown(), LookupOutcome.PROCESSING) == [DeliveryReconciled]
    assert _lookup(unknown(), LookupOutcome.LOOKUP_ERROR) == [DeliveryReconciled]
    assert _lookup(unknown(), LookupOutcome.FAILED, provider_status="failed") == [
        DeliveryReconciled,
        DeliveryFailed,
    ]
    # No lookup and no declared dedupe: an operator decides, nothing is retried.
    assert _lookup(unknown(), LookupOutcome.UNSUPPORTED) == [DeliveryReconciled]
    declared = core_context(dedupes=True)
    result = LookupResult(LookupOutcome.UNSUPPORTED, "no lookup URL")
    events = after_lookup(unknown(), result, T0, declared)
    assert [type(e) for e in events] == classes(DeliveryReconciled, DeliveryRetryScheduled)
    assert isinstance(events[1], DeliveryRetryScheduled)
    assert "receiver_dedupes=true" in events[1].safety
    assert events[1].dedupe_rule == "webhook-id"
    # A retry made safe by anything else names no dedupe rule.
    two = after_lookup(
        unknown(LookupOutcome.NOT_FOUND, 1), LookupResult(LookupOutcome.NOT_FOUND, "404"), T0, CTX
    )
    assert isinstance(two[1], DeliveryRetryScheduled)
    assert two[1].dedupe_rule is None


def test_a_dedupe_rule_is_relied_on_only_within_its_window() -> None:
    rule = DedupeRule("idempotency-key-24h", "the provider keeps keys 24 h", window_s=24 * 3600)
    ctx = replace(CTX, dedupe_rule=lambda _channel, _recipient: rule)
    state = unknown()
    result = LookupResult(LookupOutcome.UNSUPPORTED, "no lookup")
    inside = state.requested_at + timedelta(hours=23)
    events = after_lookup(state, result, inside, ctx)
    assert [type(e) for e in events] == classes(DeliveryReconciled, DeliveryRetryScheduled)
    assert isinstance(events[1], DeliveryRetryScheduled)
    assert events[1].dedupe_rule == "idempotency-key-24h"
    # Past the window a repeat may be taken as new: UNKNOWN stays, for an operator.
    past = state.requested_at + timedelta(hours=24)
    assert [type(e) for e in after_lookup(state, result, past, ctx)] == [DeliveryReconciled]


def test_the_first_lookup_waits_the_settle_window_then_the_spacing() -> None:
    assert due_at(unknown(), CTX) == T0 + timedelta(seconds=15)
    assert due_at(unknown(LookupOutcome.NOT_FOUND, 1), CTX) == T0 + timedelta(
        seconds=CTX.lookup_confirm_spacing_s
    )
    assert due_at(unknown(LookupOutcome.UNSUPPORTED), CTX) is None  # an operator's
    exhausted = replace(unknown(LookupOutcome.PROCESSING), lookups=CTX.max_lookups)
    assert due_at(exhausted, CTX) is None


def test_a_stuck_receiver_key_is_recorded_for_an_operator_and_never_looked_up_again() -> None:
    state = unknown(LookupOutcome.PROCESSING)
    result = LookupResult(LookupOutcome.STUCK, "GET .../lookup/k -> 409: stuck")
    events = after_lookup(state, result, T0 + timedelta(seconds=20), CTX)
    assert [type(e) for e in events] == [DeliveryReconciled]  # no retry, no verdict
    after = apply(state, events[0])
    assert after is not None
    assert (after.status, after.last_error_class) == (Status.UNKNOWN, ErrorClass.RECEIVER_STUCK)
    assert due_at(after, CTX) is None
    assert on_timer(after, T0 + timedelta(days=1), CTX) == ([], None)


def test_sent_gives_up_into_unknown_with_a_reason() -> None:
    sent = replace(claimed(), status=Status.SENT, provider_status="queued", updated_at=T0)
    assert on_timer(sent, T0 + timedelta(seconds=5), CTX)[1] == "lookup"
    given_up = replace(sent, lookups=CTX.max_sent_polls)
    events, action = on_timer(given_up, T0, CTX)
    assert action is None
    assert isinstance(events[0], DeliveryUnknown)
    assert events[0].error_class == ErrorClass.SENT_UNCONFIRMED
    assert "polling gave up" in events[0].reason
    after = apply(given_up, events[0])
    assert after is not None
    assert after.status is Status.UNKNOWN
    assert due_at(after, CTX) is None  # stays visible for an operator


def test_only_the_claim_holder_can_say_nothing_was_sent() -> None:
    """Two claims under one token (a worker that claimed from a state missing the other's
    claim): the loser's "not sent" must not reset the winner's attempt, or the next claim
    would retry without a lookup after the winner's request may have arrived."""
    first = apply(None, requested(7))
    assert first is not None
    winner = claim(first, T0, core_context(worker_id="w1"))
    loser = claim(first, T0, core_context(worker_id="w2"))  # the same token, from w2
    state = apply(apply(first, winner), loser)
    assert state is not None
    assert (state.claim_worker, state.fencing_token) == ("w1", 1)

    def not_sent(by: str) -> DeliveryNotSent:
        return DeliveryNotSent(
            idempotency_key=first.idempotency_key,
            run_id=first.run_id,
            producer=f"test/{by}",
            attempt=1,
            fencing_token=1,
            worker_id=by,
            error_class="fenced",
            reason="the claim under token 1 is no longer current",
        )

    assert applied(state, not_sent("w2")).status is Status.CLAIMED
    assert applied(state, not_sent("w1")).status is Status.PENDING
