"""Send budgets in the projection (projections/budgets.py): ``ledger.budgets`` folded by the
book's own rule into both backends, read back as each budget's use of its current window.
"""

from __future__ import annotations

from datetime import timedelta

from clients.budget_actions import BudgetActions
from clients.outcome_keys import signer_for
from clients.signed_log import SignedLog
from config.settings import Settings
from events.budget_codec import dumps_book, loads_book
from events.budgets import (
    AnyBudgetEvent,
    BudgetBook,
    BudgetCleared,
    BudgetEvent,
    BudgetOperatorEvent,
    BudgetReleased,
    BudgetSet,
    BudgetSpent,
    encode_budget,
    record_key,
)
from events.waiting import DeliveryHeld, WaitReason
from projections.backends import open_store
from projections.budgets import budget_use
from projections.projector import rebuild
from projections.schema import BUDGET_BOOKS, BUDGETS
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import T0, P, at, publish, requested, snapshot

AGENT = "runaway"


def budget(limit: int, agent: str = AGENT, channel: str | None = None) -> BudgetSet:
    return BudgetSet(
        agent=agent, channel=channel, limit=limit, window_s=3600, operator="ana",
        reason="a loop", producer="ledger-operator", occurred_at=T0,
    )  # fmt: skip


def spent(n: int, t: float, agent: str = AGENT) -> BudgetSpent:
    return BudgetSpent(
        agent=agent, channel="webhook", idempotency_key=requested("run-b", n, 1).idempotency_key,
        window_start=T0, producer="w1", occurred_at=at(t),
    )  # fmt: skip


def released(count: int, t: float) -> BudgetReleased:
    return BudgetReleased(
        agent=AGENT, count=count, operator="ana", reason="checked", producer="ledger-operator",
        occurred_at=at(t),
    )  # fmt: skip


def story() -> list[AnyBudgetEvent]:
    """Limit 2: keys 1, 2 granted, 3 and 4 over; a release of 3 grants 3 and 4 and adds one
    to the window; another agent's budget is set, then cleared."""
    return [
        budget(2),
        budget(5, agent="gone"),
        *(spent(n, n) for n in (1, 2, 3, 4)),
        spent(2, 5),  # a repeat changes nothing
        released(3, 10),
        BudgetCleared(
            agent="gone",
            operator="ana",
            reason="done",
            producer="ledger-operator",
            occurred_at=at(11),
        ),
    ]


async def append_budgets(settings: Settings, events: list[AnyBudgetEvent]) -> None:
    """Each event as its writer writes it: an operator's signed with the operator key, a
    worker's spend with the worker's."""

    def encode(event: BudgetEvent) -> bytes:
        return encode_budget(event)

    async with (
        BudgetActions(settings) as operator,
        SignedLog[BudgetEvent](
            settings, settings.kafka.topic_budgets, signer_for(settings), encode, record_key
        ) as worker,
    ):
        for event in events:
            if isinstance(event, BudgetOperatorEvent):
                await operator.append([event])
            else:
                await worker.append([event])


def test_a_book_reads_back_as_it_was_written() -> None:
    events = story()
    book = BudgetBook().apply_all(events)
    again = loads_book(dumps_book(book))
    assert dumps_book(again) == dumps_book(book)
    # The same verdicts, and a release read twice still counts once.
    for n in (1, 2, 3, 4, 5):
        key = requested("run-b", n, 1).idempotency_key
        assert again.judge(AGENT, "webhook", key, at(20)) == book.judge(
            AGENT, "webhook", key, at(20)
        )
    again.apply(events[7])  # the release, read again
    assert again.applied == book.applied + 1
    assert again.budgets[(AGENT, None)].windows == book.budgets[(AGENT, None)].windows
    assert again.budgets[(AGENT, None)].granted == book.budgets[(AGENT, None)].granted


async def test_each_budget_shows_its_limit_use_reset_and_held(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    events = story()
    await append_budgets(settings, events)
    # Two deliveries of the agent held over budget on the projection's side (one needed no
    # spend: its window was full), and one of another agent held for a paused endpoint.
    held = [requested("run-b", n, 1) for n in (5, 6)]
    held = [r.model_copy(update={"producer": AGENT}) for r in held]
    await publish(
        settings,
        [
            *held,
            *(
                DeliveryHeld(
                    idempotency_key=r.idempotency_key,
                    run_id=r.run_id,
                    producer=P,
                    reason=WaitReason.OVER_BUDGET,
                    detail="spent",
                    occurred_at=at(30),
                )
                for r in held
            ),
        ],
    )
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        [use] = budget_use(store, T0 + timedelta(minutes=30))
        # 2 granted within the limit, 2 released (over), 1 allowance left: 4 of 3 + 1.
        assert (use.agent, use.channel, use.limit, use.window) == (AGENT, None, 2, "1h")
        assert (use.used, use.allowed, use.held) == (2, 3, 2)
        assert use.window_start == "2026-01-05T09:00:00.000000Z"
        assert use.resets_at == "2026-01-05T10:00:00.000000Z"
        # The next window has used nothing yet; the held wait on.
        [later] = budget_use(store, T0 + timedelta(hours=1, minutes=5))
        assert (later.used, later.allowed, later.held) == (0, 2, 2)
        assert later.resets_at == "2026-01-05T11:00:00.000000Z"
        [book] = store.rows(f"SELECT book FROM {BUDGET_BOOKS.name} WHERE agent = ?", (AGENT,))
        assert book["book"] == dumps_book(BudgetBook().apply_all(events[:1] + events[2:8]))
        assert [r["agent"] for r in store.rows(f"SELECT agent FROM {BUDGETS.name}")] == [AGENT]
    finally:
        store.close()
    # Folded one record at a time (the book read back between batches): the same rows.
    one_by_one = dsn_factory()
    await rebuild(settings, one_by_one, batch_size=1)
    assert snapshot(one_by_one)[1] == snapshot(dsn)[1]
