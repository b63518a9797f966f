"""Operator events in the one transition table (events/delivery_state.py): each transition
and each refusal, one test apiece; and what the decisions (streams/decisions.py) make of a
redriven delivery: the retry policy counted afresh, a fresh lookup due."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal

import pytest

from events.delivery import (
    DeliveryClaimed,
    DeliveryFailed,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
)
from events.delivery_state import DeliveryState, Status, operator_refusal
from events.operator import DeliveryRedriveRequested, DeliveryResolved, OperatorEvent
from events.outcomes import ErrorClass, LookupOutcome
from streams.decisions import claim, due_at, on_timer, retry_or_fail
from tests.fixtures.core import T0, applied, core_context, requested

CTX = core_context(settle_s=15.0)
SLO = 300  # tests.fixtures.core.requested
Outcome = Literal["delivered", "not_delivered", "abandoned"]


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def claimed(at: float = 1) -> DeliveryState:
    state = applied(None, requested())
    return applied(state, claim(state, later(at), CTX))


def _common(state: DeliveryState, at: float) -> dict[str, object]:
    return {
        "idempotency_key": state.idempotency_key,
        "run_id": state.run_id,
        "producer": "t",
        "occurred_at": later(at),
    }


def unknown(at: float = 2) -> DeliveryState:
    state = claimed()
    return applied(
        state,
        DeliveryUnknown(
            **_common(state, at),
            attempt=state.attempt,
            fencing_token=state.fencing_token,
            error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
            reason="read timeout after the request was written",
        ),
    )


def sent(at: float = 2) -> DeliveryState:
    state = claimed()
    return applied(
        state,
        DeliverySent(
            **_common(state, at),
            attempt=state.attempt,
            fencing_token=state.fencing_token,
            worker_id="w1",
            provider_message_id="m-1",
            provider_status="queued",
        ),
    )


def failed(state: DeliveryState | None = None, at: float = 2) -> DeliveryState:
    state = state or claimed()
    return applied(
        state,
        DeliveryFailed(
            **_common(state, at),
            attempts=state.attempt,
            error_class=ErrorClass.HTTP_4XX,
            reason="410 Gone",
        ),
    )


def lookup(state: DeliveryState, outcome: LookupOutcome, at: float = 3) -> DeliveryState:
    return applied(
        state,
        DeliveryReconciled(
            **_common(state, at),
            attempt=state.attempt,
            fencing_token=state.fencing_token,
            outcome=outcome,
            evidence=f"lookup: {outcome}",
        ),
    )


def resolve(
    state: DeliveryState,
    outcome: Outcome,
    at: float = 10,
    *,
    token: int | None = None,
    seen: Literal["UNKNOWN", "SENT", "FAILED"] | None = None,
    receiver_id: str | None = None,
) -> DeliveryResolved:
    return DeliveryResolved(
        **_common(state, at),
        operator="ana",
        reason="the receiver's log shows it",
        scope="key",
        fencing_token=state.fencing_token if token is None else token,
        seen_status=seen or _seen(state),
        outcome=outcome,
        receiver_id=receiver_id,
    )


def redrive(
    state: DeliveryState,
    at: float = 10,
    *,
    token: int | None = None,
    seen: Literal["UNKNOWN", "SENT", "FAILED"] | None = None,
) -> DeliveryRedriveRequested:
    return DeliveryRedriveRequested(
        **_common(state, at),
        operator="bo",
        reason="the endpoint is fixed",
        scope="recipient=https://hooks.example/0 state=FAILED",
        fencing_token=state.fencing_token if token is None else token,
        seen_status=seen or _seen(state),
    )


def _seen(state: DeliveryState) -> Literal["UNKNOWN", "SENT", "FAILED"]:
    if state.status is Status.SENT:
        return "SENT"
    if state.status is Status.FAILED:
        return "FAILED"
    return "UNKNOWN"


def refused(state: DeliveryState, event: OperatorEvent, why: str) -> None:
    """``event`` is refused on ``state`` for ``why``, and changes nothing but ``seen``."""
    refusal = operator_refusal(state, event)
    assert refusal is not None
    assert why in refusal
    after = applied(state, event)
    assert after == replace(state, seen=(*state.seen, str(event.event_id)))


# Transitions ------------------------------------------------------------------------


def test_resolve_delivered_confirms_an_unknown_settled_by_the_operator() -> None:
    after = applied(unknown(), resolve(unknown(), "delivered", receiver_id="rcv-9"))
    assert after.status is Status.CONFIRMED
    assert after.settled_by == "ana"
    assert after.provider_message_id == "rcv-9"
    assert after.last_reason is not None
    assert "settled as delivered by operator ana" in after.last_reason
    assert (after.redrives, after.check_at) == (0, None)


def test_resolve_delivered_without_a_receiver_id_keeps_the_provider_id() -> None:
    state = sent()
    after = applied(state, resolve(state, "delivered", at=SLO + 1))
    assert (after.status, after.provider_message_id) == (Status.CONFIRMED, "m-1")


def test_resolve_not_delivered_makes_a_new_attempt_under_a_newer_token() -> None:
    state = unknown()
    after = applied(state, resolve(state, "not_delivered", at=20))
    assert after.status is Status.PENDING
    assert (after.attempt_base, after.policy_from) == (state.attempt, later(20))
    assert after.redrives == 0  # a resolve is not a redrive
    assert after.settled_by is None
    again = applied(after, claim(after, later(21), CTX))
    assert again.status is Status.CLAIMED
    assert again.fencing_token > state.fencing_token
    assert again.attempt == state.attempt + 1


def test_resolve_abandoned_fails_it_for_the_operator() -> None:
    state = unknown()
    after = applied(state, resolve(state, "abandoned"))
    assert after.status is Status.FAILED
    assert after.last_error_class == ErrorClass.ABANDONED_BY_OPERATOR
    assert after.settled_by == "ana"


@pytest.mark.parametrize("outcome", ["delivered", "not_delivered", "abandoned"])
def test_resolve_applies_to_sent_past_its_slo(outcome: Outcome) -> None:
    state = sent()
    assert operator_refusal(state, resolve(state, outcome, at=SLO)) is None


def test_redrive_of_failed_is_a_new_attempt_under_a_newer_token() -> None:
    state = failed()
    after = applied(state, redrive(state, at=30))
    assert after.status is Status.PENDING
    assert after.redrives == 1
    assert (after.attempt_base, after.policy_from) == (1, later(30))
    assert after.last_reason is not None
    assert "redriven by operator bo" in after.last_reason
    again = applied(after, claim(after, later(31), CTX))
    assert (again.status, again.attempt, again.fencing_token) == (Status.CLAIMED, 2, 2)


def test_the_old_attempts_late_failure_is_moot_after_a_redrive() -> None:
    state = failed()
    after = applied(state, redrive(state))
    late = DeliveryFailed(
        **_common(state, 11), attempts=1, error_class=ErrorClass.HTTP_4XX, reason="late 410"
    )
    assert applied(after, late).status is Status.PENDING


def test_redrive_of_unknown_asks_for_a_lookup_now() -> None:
    state = lookup(lookup(unknown(), LookupOutcome.LOOKUP_ERROR), LookupOutcome.PROCESSING)
    after = applied(state, redrive(state, at=40))
    assert after.status is Status.UNKNOWN
    assert after.fresh_lookup
    assert (after.reconciled, after.lookups, after.not_found) == (None, 0, 0)
    assert (after.check_at, after.redrives) == (later(40), 1)
    # The lookup's answer, read back, ends the fresh turn.
    assert not lookup(after, LookupOutcome.NOT_FOUND, at=56).fresh_lookup


def test_a_redelivered_action_applies_once() -> None:
    state = failed()
    action = redrive(state)
    after = applied(state, action)
    assert applied(after, action) is after


# Refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["delivered", "not_delivered", "abandoned"])
def test_nothing_changes_a_confirmed_delivery(outcome: Outcome) -> None:
    state = applied(unknown(), resolve(unknown(), "delivered"))
    refused(state, resolve(state, outcome, seen="UNKNOWN"), "CONFIRMED, which is final")
    refused(state, redrive(state, seen="UNKNOWN"), "CONFIRMED, which is final")


def test_resolve_of_sent_within_its_slo_is_refused() -> None:
    state = sent()
    refused(state, resolve(state, "delivered", at=SLO - 1), "SENT within its SLO")


@pytest.mark.parametrize("outcome", ["delivered", "not_delivered", "abandoned"])
def test_resolve_of_failed_pending_or_claimed_is_refused(outcome: Outcome) -> None:
    for state in (failed(), claimed(), applied(None, requested())):
        refused(state, resolve(state, outcome), "applies to UNKNOWN (and SENT past its SLO)")


def test_redrive_of_sent_pending_or_claimed_is_refused() -> None:
    for state in (sent(), claimed(), applied(None, requested())):
        refused(state, redrive(state), "applies to FAILED and UNKNOWN")


def test_a_stale_token_is_refused() -> None:
    state = failed()
    refused(state, redrive(state, token=state.fencing_token - 1), "stale")
    state = unknown()
    refused(state, resolve(state, "delivered", token=state.fencing_token + 1), "stale")


def test_a_stale_status_is_refused() -> None:
    # Seen UNKNOWN, since then failed on the lookup's evidence (same token).
    state = failed(lookup(unknown(), LookupOutcome.FAILED), at=5)
    assert state.status is Status.FAILED
    refused(state, redrive(state, seen="UNKNOWN"), "stale: issued for UNKNOWN")


def test_an_action_raced_by_the_next_attempt_is_refused() -> None:
    # Two operators redrive the same FAILED: the first applies, the second is stale once
    # the new attempt is claimed (and refused as not FAILED before that).
    state = failed()
    first, second = redrive(state), redrive(state, at=11)
    pending = applied(state, first)
    refused(pending, second, "applies to FAILED and UNKNOWN, not PENDING")
    again = applied(pending, claim(pending, later(12), CTX))
    refused(failed(again, at=13), second, "stale")


@pytest.mark.parametrize(
    ("outcome", "says"),
    [(LookupOutcome.UNSUPPORTED, "has no lookup"), (LookupOutcome.STUCK, "says stuck")],
)
def test_redrive_of_an_unknown_no_lookup_can_settle_is_refused(
    outcome: LookupOutcome, says: str
) -> None:
    state = lookup(unknown(), outcome)
    refused(state, redrive(state), says)
    refused(state, redrive(state), "ledger resolve")
    # ... and resolve is the way.
    assert applied(state, resolve(state, "not_delivered")).status is Status.PENDING


def test_a_stuck_receiver_keeps_the_unknown_for_an_operator() -> None:
    state = lookup(unknown(), LookupOutcome.STUCK)
    assert (state.status, state.last_error_class) == (Status.UNKNOWN, ErrorClass.RECEIVER_STUCK)
    assert due_at(state, CTX) is None


# Decisions after an action -----------------------------------------------------------


def _exhausted_by_attempts() -> DeliveryState:
    """A webhook delivery whose 10 attempts (the policy's limit) all failed with a 5xx."""
    state = applied(None, requested())
    for n in range(10):
        state = applied(state, claim(state, later(n * 10 + 1), CTX))
        event = retry_or_fail(
            state, ErrorClass.HTTP_5XX, "5xx, nothing kept", later(n * 10 + 2), CTX
        )
        state = applied(state, event)
    assert state.status is Status.FAILED
    assert state.attempt == 10
    return state


def test_after_a_redrive_of_failed_the_retry_policy_counts_afresh_from_attempts() -> None:
    state = _exhausted_by_attempts()
    after = applied(state, redrive(state, at=200))
    after = applied(after, claim(after, later(201), CTX))
    assert after.attempt == 11
    again = retry_or_fail(after, ErrorClass.HTTP_5XX, "5xx", later(202), CTX)
    # Without the redrive, attempt 11 would be past the limit of 10; with it, attempt 1.
    assert isinstance(again, DeliveryRetryScheduled)
    assert again.retry_at == later(202) + timedelta(
        seconds=CTX.rules("webhook", after.recipient).delay_s(after.idempotency_key, 1)
    )
    assert isinstance(
        retry_or_fail(replace(after, attempt_base=0), ErrorClass.HTTP_5XX, "5xx", later(202), CTX),
        DeliveryFailed,
    )


def test_after_a_redrive_of_failed_the_retry_policy_counts_age_from_the_action() -> None:
    # Failed after the policy's 24 h; redriven two days later: a retry is still due.
    state = failed()
    two_days = 2 * 24 * 3600
    after = applied(state, redrive(state, at=two_days))
    after = applied(after, claim(after, later(two_days + 1), CTX))
    now = later(two_days + 2)
    assert isinstance(
        retry_or_fail(after, ErrorClass.HTTP_5XX, "5xx", now, CTX), DeliveryRetryScheduled
    )
    blind = replace(after, policy_from=None, attempt_base=0)
    assert isinstance(retry_or_fail(blind, ErrorClass.HTTP_5XX, "5xx", now, CTX), DeliveryFailed)


def test_after_resolve_not_delivered_the_policy_counts_afresh_too() -> None:
    # An UNKNOWN at the policy's last attempt: no retry on the policy's count alone...
    last = replace(unknown(), attempt=10, fencing_token=10)
    assert isinstance(
        retry_or_fail(last, ErrorClass.HTTP_5XX, "5xx", later(3), CTX), DeliveryFailed
    )
    # ...but the operator's "not delivered" starts a new count.
    after = applied(last, resolve(last, "not_delivered", at=500))
    after = applied(after, claim(after, later(501), CTX))
    assert (after.attempt, after.attempt_base) == (11, 10)
    again = retry_or_fail(after, ErrorClass.HTTP_5XX, "5xx", later(502), CTX)
    assert isinstance(again, DeliveryRetryScheduled)


def test_after_a_redrive_of_unknown_a_fresh_lookup_is_due() -> None:
    # Lookups gave up (max_lookups reached): no timer; a redrive makes a lookup due.
    state = unknown()
    for n in range(CTX.max_lookups):
        state = lookup(state, LookupOutcome.LOOKUP_ERROR, at=3 + n)
    assert due_at(state, CTX) is None
    after = applied(state, redrive(state, at=100))
    assert after.fresh_lookup
    assert due_at(after, CTX) == later(100 + 15)  # the settle time, from the action
    assert on_timer(after, later(114), CTX) == ([], None)
    events, action = on_timer(after, later(115), CTX)
    assert events == []
    assert action is not None
    assert action.value == "lookup"


def test_after_a_redrive_of_unknown_a_found_lookup_moves_on_as_ever() -> None:
    state = lookup(lookup(unknown(), LookupOutcome.NOT_FOUND), LookupOutcome.NOT_FOUND, at=4)
    after = applied(state, redrive(state, at=50))
    # The not-found evidence before the redrive no longer counts: a retry needs new.
    retry = DeliveryRetryScheduled(
        **_common(after, 51),
        attempt=after.attempt,
        next_attempt=after.attempt + 1,
        retry_at=later(52),
        error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
        safety="not found twice (before the redrive)",
    )
    assert applied(after, retry).status is Status.UNKNOWN
    found = applied(
        after,
        DeliveryReconciled(
            **_common(after, 66),
            attempt=after.attempt,
            fencing_token=after.fencing_token,
            outcome=LookupOutcome.FOUND,
            provider_message_id="m-7",
            evidence="found",
        ),
    )
    assert (found.status, found.fresh_lookup) == (Status.SENT, False)


def test_a_new_claim_is_refused_while_the_redrive_waits_for_nothing() -> None:
    # A claim under an old token after a redrive is not the new attempt.
    state = failed()
    after = applied(state, redrive(state))
    stale = DeliveryClaimed(
        **_common(after, 12),
        attempt=after.attempt + 1,
        fencing_token=after.fencing_token,
        worker_id="w2",
        lease_expires_at=later(42),
    )
    assert applied(after, stale).status is Status.PENDING
