"""The worker's fold (events/delivery_state.py) and the projection's fold agree on every
history: the same random delivery logs, with redelivered records, stale attempts' late
outcomes, late confirmations after FAILED, NotSent, repeated lookups and SENT giving up
into UNKNOWN, end in the same public status (and the fields that follow from it).

Run with ``--hypothesis-show-statistics`` to see which cases the histories reach."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from events.codec import encode
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
    new_delivery_requested,
)
from events.delivery_state import DeliveryState, Status, operator_refusal
from events.delivery_state import apply as worker_apply
from events.model import AnyDeliveryEvent
from events.operator import OperatorEvent
from events.outcomes import ErrorClass
from projections.records import decode_at
from projections.worker_refold import WorkerFold, compare_rules
from tests.fixtures.folds import projection_dump, projection_fold, projection_tables
from tests.fixtures.operator_events import label, operator_event

T0 = datetime(2026, 12, 1, tzinfo=UTC)
OUTCOMES = ["found", "processing", "not_found", "failed", "unsupported", "lookup_error"]
ACTIONS = [
    "claim",
    "claim",
    "sent",
    "confirmed",
    "unknown",
    "sent_unconfirmed",
    "not_sent",
    "reconciled",
    "reconciled",
    "retry",
    "failed",
    "redeliver",
    "duplicate",
    "request_again",
    "lookups_then_retry",
    "provider_failed",
    "operator",
    "operator",
]


def _request(n: int) -> DeliveryRequested:
    return new_delivery_requested(
        run_id=f"run-agree-{n}",
        event_type="run.succeeded",
        channel="webhook",
        recipient=f"http://127.0.0.1:9/hooks/{n}",
        payload={"n": n},
        slo_seconds=60,
        producer="t",
        occurred_at=T0,
    )


REQUESTS = [_request(0), _request(1)]


@st.composite
def delivery_history(draw: Any, req: DeliveryRequested) -> list[AnyDeliveryEvent]:
    """A plausible log of one delivery, with noise: each outcome is for the current
    attempt or (sometimes) a superseded one, records are redelivered, claims go stale."""
    common = {"idempotency_key": req.idempotency_key, "run_id": req.run_id, "producer": "t"}
    log: list[AnyDeliveryEvent] = [req]
    tokens: dict[int, int] = {}  # attempt -> its fencing token
    token = 0
    for step in range(draw(st.integers(1, 24))):
        t = T0 + timedelta(seconds=10 * (step + 1))
        base: dict[str, Any] = {**common, "occurred_at": t}
        action = draw(st.sampled_from(ACTIONS))
        attempt = max(tokens, default=0)
        if attempt > 1 and draw(st.integers(0, 3)) == 0:
            attempt = draw(st.integers(1, attempt - 1))  # a superseded attempt's outcome
        tok = tokens.get(attempt, token)
        if action == "claim":
            # The next attempt under a newer token, or (rarely) a stale claim.
            if draw(st.integers(0, 5)) == 0 and tokens:
                attempt, tok = attempt, tok
            else:
                attempt, token = max(tokens, default=0) + 1, token + draw(st.integers(1, 2))
                tok = tokens[attempt] = token
            log.append(
                DeliveryClaimed(
                    **base,
                    attempt=attempt,
                    worker_id=draw(st.sampled_from(["w1", "w2"])),
                    fencing_token=tok,
                    lease_expires_at=t + timedelta(seconds=30),
                )
            )
        elif action == "redeliver":
            log.append(draw(st.sampled_from(log)))
        elif action == "duplicate":
            log.append(
                DuplicateDeliveryRequest(
                    **base,
                    duplicate_event_id=req.event_id,
                    payload_hash=req.payload_hash,
                    original_payload_hash=req.payload_hash,
                    outcome=draw(st.sampled_from(["deduplicated", "conflict"])),
                )
            )
        elif action == "request_again":
            log.append(req.model_copy(update={"event_id": _uuid(draw)}))
        elif action == "operator":
            # Aimed as the CLI aims it (at the state the log has reached), stale, or blind.
            state = functools.reduce(worker_apply, log, None)
            assert state is not None
            log.append(draw(operator_event(state, t)))
        elif attempt == 0 and (action != "failed" or draw(st.integers(0, 3))):
            continue  # outcomes need an attempt; FAILED may (rarely) come before any claim
        elif action == "sent":
            log.append(
                DeliverySent(
                    **base,
                    attempt=attempt,
                    fencing_token=tok,
                    worker_id="w1",
                    provider_message_id=f"m-{attempt}",
                    provider_status="queued",
                    http_status=202,
                )
            )
        elif action == "confirmed":
            log.append(
                DeliveryConfirmed(
                    **base,
                    attempt=attempt,
                    fencing_token=tok,
                    source=draw(st.sampled_from(["send", "reconciliation"])),
                    provider_message_id=f"m-{attempt}",
                    evidence="delivered",
                )
            )
        elif action in ("unknown", "sent_unconfirmed"):
            error = (
                ErrorClass.SENT_UNCONFIRMED
                if action == "sent_unconfirmed"
                else ErrorClass.TIMEOUT_AFTER_WRITE
            )
            log.append(
                DeliveryUnknown(
                    **base, attempt=attempt, fencing_token=tok, error_class=error, reason="r"
                )
            )
        elif action == "not_sent":
            log.append(
                DeliveryNotSent(
                    **base,
                    attempt=attempt,
                    fencing_token=tok,
                    worker_id="w1",
                    error_class=ErrorClass.FENCED,
                    reason="lease too short",
                )
            )
        elif action == "lookups_then_retry":
            # The evidence a retry out of UNKNOWN needs: not_found n times (or unsupported).
            n = draw(st.integers(1, 3))
            outcome = draw(st.sampled_from(["not_found", "not_found", "unsupported"]))
            if draw(st.booleans()):
                log.append(
                    DeliveryUnknown(
                        **base,
                        attempt=attempt,
                        fencing_token=tok,
                        error_class=ErrorClass.LEASE_EXPIRED,
                        reason="lease expired",
                    )
                )
            log += [
                DeliveryReconciled(
                    **base, attempt=attempt, fencing_token=tok, outcome=outcome, evidence="e"
                )
                for _ in range(n)
            ]
            log.append(
                DeliveryRetryScheduled(
                    **base,
                    attempt=attempt,
                    next_attempt=attempt + 1,
                    retry_at=t + timedelta(seconds=5),
                    error_class=ErrorClass.TIMEOUT_AFTER_WRITE,
                    safety=f"{outcome} x{n}",
                )
            )
        elif action == "provider_failed":
            log += [
                DeliveryReconciled(
                    **base, attempt=attempt, fencing_token=tok, outcome="failed", evidence="e"
                ),
                DeliveryFailed(
                    **base, attempts=attempt, error_class=ErrorClass.PROVIDER_FAILED, reason="f"
                ),
            ]
        elif action == "reconciled":
            outcome = draw(st.sampled_from(OUTCOMES))
            log.append(
                DeliveryReconciled(
                    **base,
                    attempt=attempt,
                    fencing_token=tok,
                    outcome=outcome,
                    provider_message_id=f"m-{attempt}" if outcome == "found" else None,
                    provider_status="failed" if outcome == "failed" else None,
                    evidence="lookup",
                )
            )
        elif action == "retry":
            log.append(
                DeliveryRetryScheduled(
                    **base,
                    attempt=attempt,
                    next_attempt=attempt + 1,
                    retry_at=t + timedelta(seconds=5),
                    error_class=ErrorClass.HTTP_5XX,
                    safety="not found twice",
                )
            )
        else:
            log.append(
                DeliveryFailed(**base, attempts=attempt, error_class="http_4xx", reason="410")
            )
    return log


def _uuid(draw: Any) -> Any:
    import uuid

    return uuid.UUID(int=draw(st.integers(1, 2**64)), version=4)


@st.composite
def histories(draw: Any) -> tuple[list[AnyDeliveryEvent], list[int]]:
    """Two deliveries' histories interleaved in one partition, and batch cut points."""
    first, second = (draw(delivery_history(req)) for req in REQUESTS)
    # Each delivery keeps its order (one key, one partition); the two interleave freely.
    merged: list[AnyDeliveryEvent] = []
    queues = [list(reversed(first)), list(reversed(second))]
    while queues[0] and queues[1]:
        merged.append(queues[draw(st.integers(0, 1))].pop())
    merged += reversed(queues[0] or queues[1])
    cuts = draw(st.lists(st.integers(0, len(merged)), max_size=4))
    return merged, cuts


def worker_fold(log: list[AnyDeliveryEvent]) -> dict[str, DeliveryState]:
    """The worker's rules, and hypothesis ``event()`` labels for the cases reached."""
    states: dict[str, DeliveryState | None] = {}
    seen: set[str] = set()
    for e in log:
        before = states.get(e.idempotency_key)
        if str(e.event_id) in seen:
            event("a redelivered record")
        seen.add(str(e.event_id))
        after = states[e.idempotency_key] = worker_apply(before, e)
        if before is None or after is None:
            continue
        old, new = before.status, after.status
        stale = getattr(e, "fencing_token", before.fencing_token) != before.fencing_token
        if stale and isinstance(e, DeliveryConfirmed) and new is Status.CONFIRMED:
            event("a superseded attempt's late CONFIRMED applied")
        elif stale and old is new and not isinstance(e, DeliveryClaimed):
            event("a stale-token outcome ignored")
        if old is Status.FAILED and new is Status.CONFIRMED:
            event("late CONFIRMED after FAILED")
        if isinstance(e, DeliveryNotSent) and old is not new:
            event(f"NotSent: {old} -> PENDING")
        if old is Status.SENT and new is Status.UNKNOWN:
            event("SENT -> UNKNOWN (sent_unconfirmed)")
        if old is Status.UNKNOWN and new is Status.RETRY_SCHEDULED:
            event(f"retry out of UNKNOWN after {before.reconciled} x{before.not_found}")
        if old is Status.UNKNOWN and isinstance(e, DeliveryRetryScheduled) and old is new:
            event("retry out of UNKNOWN refused (not enough evidence)")
        if isinstance(e, DeliveryFailed) and old in (Status.SENT, Status.UNKNOWN) and new is old:
            event(f"FAILED out of {old} refused")
        if isinstance(e, DeliveryFailed) and new is Status.FAILED and old is not new:
            event(f"FAILED out of {old}" + (" (provider failed)" if old.public == "SENT" else ""))
        if isinstance(e, DeliveryReconciled) and old is Status.UNKNOWN and new is Status.SENT:
            event("lookup found: UNKNOWN -> SENT")
        if isinstance(e, DeliveryReconciled) and not stale and old is new is Status.UNKNOWN:
            event(f"lookup {e.outcome} kept UNKNOWN")
        if isinstance(e, OperatorEvent) and after is not before:
            event(label(before, e))
    return {k: s for k, s in states.items() if s is not None}


@settings(max_examples=400, deadline=None)
@given(histories())
def test_worker_and_projection_folds_agree(
    history: tuple[list[AnyDeliveryEvent], list[int]],
) -> None:
    log, cuts = history
    worker = worker_fold(log)
    rows = projection_fold(log, cuts)
    assert set(rows) == set(worker)
    for key, state in worker.items():
        event(f"final {state.status.public}")
        row = rows[key]
        assert row["status"] == state.status.public, key
        derived = (row["attempts"], row["fencing_token"], row["provider_message_id"])
        assert derived == (state.attempt, state.fencing_token, state.provider_message_id)
        assert (row["last_error_class"], row["reconciliation"]) == (
            state.last_error_class,
            state.reconciled,
        )
        assert (row["settled_by"], row["redrives"]) == (state.settled_by, state.redrives)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_operator_actions_agree_with_the_fold_and_a_rebuild(
    history: tuple[list[AnyDeliveryEvent], list[int]],
) -> None:
    """Every operator action read once is one operator_actions row, applied exactly when
    the worker's fold applies it (refused: with the fold's own reason); and a rebuild (one
    batch, into an empty database) gives the live projection's tables, row for row."""
    log, cuts = history
    expected = []
    states: dict[str, DeliveryState | None] = {}
    for e in log:
        before = states.get(e.idempotency_key)
        after = states[e.idempotency_key] = worker_apply(before, e)
        if isinstance(e, OperatorEvent) and before is not None and after is not before:
            refusal = operator_refusal(before, e)
            expected.append((str(e.event_id), "refused" if refusal else "applied", refusal))
    tables = projection_tables(log, cuts)
    found = [(r["event_id"], r["result"], r["refusal"]) for r in tables["operator_actions"]]
    assert sorted(found) == sorted(expected)
    for result in {r for _, r, _ in expected}:
        event(f"operator actions {result} in the projection")
    live = projection_dump(log, cuts, "project")
    assert projection_dump(log, [], "rebuild") == live
    # And 'ledger verify''s own check: the rows against the worker's rules, re-folded.
    fold = WorkerFold()
    fold([decode_at("ledger.deliveries", 0, n, encode(e)) for n, e in enumerate(log)])
    assert compare_rules(live["deliveries"], fold) == []
