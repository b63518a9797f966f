"""The budget gate (streams/budget_gate.py) in the worker's processor, broker-free: spends
are appended before a claim, the log's order decides, the over-budget one is held (once,
recorded) and makes no attempt, a release lets it go."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

from clients.outcome_signing import OutcomeSigner, OutcomeVerifier, new_pair, private_key
from config.settings import Settings
from events.budgets import (
    BudgetEvent,
    BudgetReleased,
    BudgetSet,
    BudgetSpent,
    Verdict,
    encode_budget,
    record_key,
)
from events.codec import encode
from events.delivery import DeliveryClaimed
from events.delivery_state import apply
from events.waiting import DeliveryHeld, WaitReason
from streams.budget_gate import BudgetGate, BudgetLog
from streams.gates import Gates
from streams.processor import MemoryStore, Record
from streams.timers import DueIndex
from tests.fixtures.core import T0, Appended, Clock, requested
from tests.streams.test_processor import processor_for


class LoggedBudgets(BudgetLog):
    """A BudgetLog whose spends are kept for the test to 'read back' in an order it picks."""

    def __init__(self) -> None:
        super().__init__(Settings(), verifier=None, signer=None)
        self.ready = True
        self.spends: list[BudgetSpent] = []

    def spend(self, event: BudgetSpent) -> None:
        self.spends.append(event)

    def read_back(self) -> None:
        for event in self.spends:
            self.book.apply(event)
        self.spends.clear()


def operator_set(limit: int) -> BudgetSet:
    return BudgetSet(
        agent="test-agent",
        limit=limit,
        window_s=3600,
        operator="ana",
        reason="runaway",
        producer="ledger-operator",
        occurred_at=T0,
    )


def test_no_budget_no_hold_and_nothing_spent() -> None:
    budgets = LoggedBudgets()
    gate = BudgetGate(budgets, "ledger-worker/w1")
    state = apply(None, requested(1))
    assert state is not None
    assert gate.hold(state, T0) is None
    assert budgets.spends == []


def test_every_delivery_waits_until_the_budgets_are_read() -> None:
    budgets = LoggedBudgets()
    budgets.ready = False
    state = apply(None, requested(1))
    assert state is not None
    hold = BudgetGate(budgets, "w").hold(state, T0)
    assert hold is not None
    assert hold.reason is None, "an unrecorded wait: nothing is over budget yet"


def test_a_spend_is_appended_once_and_the_delivery_waits_for_its_verdict() -> None:
    budgets = LoggedBudgets()
    budgets.book.apply(operator_set(1))
    gate = BudgetGate(budgets, "ledger-worker/w1")
    state = apply(None, requested(1))
    assert state is not None
    first = gate.hold(state, T0)
    again = gate.hold(state, T0 + timedelta(seconds=1))
    assert first is not None
    assert again is not None
    assert (first.reason, again.reason) == (None, None)
    assert len(budgets.spends) == 1, "not spent again before it is read back"
    assert budgets.spends[0].idempotency_key == state.idempotency_key
    gate.hold(state, T0 + timedelta(seconds=6))
    assert len(budgets.spends) == 2, "spent again when the first never came back"
    budgets.read_back()
    assert gate.hold(state, T0 + timedelta(seconds=7)) is None


async def test_the_over_budget_delivery_is_held_recorded_once_and_released(
    tmp_path: Path, clock: Clock, appended: Appended
) -> None:
    due = DueIndex(tmp_path / "due")
    store = MemoryStore()
    budgets = LoggedBudgets()
    budgets.book.apply(operator_set(2))
    processor = processor_for(store, clock, appended, due)
    processor._gate = Gates([BudgetGate(budgets, "ledger-worker/w1")])
    requests = [requested(n, at=T0 + timedelta(seconds=n)) for n in (1, 2, 3)]
    for offset, r in enumerate(requests):
        await processor.handle(Record("t", 0, offset, r.idempotency_key.encode(), encode(r)))
    assert appended.of(DeliveryClaimed) == [], "nothing is claimed before its spend is judged"
    assert len(budgets.spends) == 3
    # The log's order decides: the third spend read is the one over budget.
    budgets.spends.sort(key=lambda s: s.idempotency_key != requests[2].idempotency_key)
    over = budgets.spends[-1].idempotency_key
    budgets.read_back()
    clock.advance(1)
    await processor.tick({0})
    claims = appended.of(DeliveryClaimed)
    assert len(claims) == 2
    assert over not in {c.idempotency_key for c in claims}
    [held] = appended.of(DeliveryHeld)
    assert (held.idempotency_key, held.reason) == (over, WaitReason.OVER_BUDGET)
    assert "2 of 2 per 1h" in held.detail
    await processor.handle(Record("t", 0, 10, held.idempotency_key.encode(), encode(held)))
    for _ in range(3):
        clock.advance(2.5)
        await processor.tick({0})
    assert len(appended.of(DeliveryHeld)) == 1, "a hold is recorded once"
    assert len(appended.of(DeliveryClaimed)) == 2
    # An operator releases one: it is claimed at the next look.
    budgets.book.apply(released(1))
    clock.advance(2.5)
    await processor.tick({0})
    claims = appended.of(DeliveryClaimed)
    assert len(claims) == 3
    assert claims[-1].idempotency_key == over
    due.close()


def test_the_reader_takes_budget_events_only_signed_by_whom_they_must_be() -> None:
    worker_key, operator_key = private_key(new_pair()[0]), private_key(new_pair()[0])
    verifier = OutcomeVerifier([worker_key.public_key()], [operator_key.public_key()])
    budgets = BudgetLog(Settings(), verifier=verifier, signer=None)
    as_worker, as_operator = OutcomeSigner(worker_key), OutcomeSigner(operator_key)
    offsets = iter(range(100))

    def read(event: BudgetEvent, signer: OutcomeSigner | None, key: bytes | None = None) -> None:
        value = encode_budget(event)
        headers = [] if signer is None else signer.headers(value)
        record = SimpleNamespace(
            topic="budgets", partition=0, offset=next(offsets), value=value, headers=headers,
            key=record_key(event) if key is None else key,
        )  # fmt: skip
        budgets._fold(record)

    limit = operator_set(0)
    read(limit, None)  # unsigned: anyone who may write the topic could have
    read(limit, as_worker)  # a worker may not set budgets
    read(limit, as_operator, key=b"another-agent")  # not in the agent's one order
    assert (budgets.refused, budgets.book.budgets) == (3, {})
    read(limit, as_operator)
    assert ("test-agent", None) in budgets.book.budgets
    state = apply(None, requested(1))
    assert state is not None
    spend = BudgetSpent(
        agent="test-agent", channel="webhook", idempotency_key=state.idempotency_key,
        window_start=T0, producer="ledger-worker/w1",
    )  # fmt: skip
    read(spend, as_operator)  # an operator's key may not spend
    read(released(1), as_worker)  # a worker's may not release
    assert budgets.refused == 5
    read(spend, as_worker)
    judged = budgets.book.judge("test-agent", "webhook", state.idempotency_key, T0)
    assert judged.verdict is Verdict.OVER, "spent, over a limit of 0"
    read(released(1), as_operator)
    assert budgets.book.judge("test-agent", "webhook", state.idempotency_key, T0).verdict is (
        Verdict.GRANTED
    )


def released(count: int) -> BudgetReleased:
    return BudgetReleased(
        agent="test-agent", count=count, operator="ana", reason="ok", producer="ledger-operator"
    )
