"""The budget gate (streams/budget_gate.py) in the worker's processor, broker-free: spends
are appended before a claim, the log's order decides, the over-budget one is held (once,
recorded) and makes no attempt, a release lets it go."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from config.settings import Settings
from events.budgets import BudgetReleased, BudgetSet, BudgetSpent
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
    budgets.book.apply(
        BudgetReleased(
            agent="test-agent", count=1, operator="ana", reason="ok", producer="ledger-operator"
        )
    )
    clock.advance(2.5)
    await processor.tick({0})
    claims = appended.of(DeliveryClaimed)
    assert len(claims) == 3
    assert claims[-1].idempotency_key == over
    due.close()
