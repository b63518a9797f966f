"""Agents' send budgets in the projection: folding ``ledger.budgets``, and asking what each
budget has used now.

The fold is the book's own (events/budgets.py ``BudgetBook``, the one rule every worker
applies): each agent's book is read from ``budget_books``, given the batch's events in log
order, and written back with one ``budgets`` row per budget it holds (its terms and the
counts of its newest window). All of an agent's budget events share one partition, so
they arrive in order, and one agent's book never depends on another's.

``budget_use`` answers, as of the caller's ``now``, per budget: the limit, the use of the
current window, when it resets, and how many deliveries are held over budget (those come
from the deliveries table: a delivery is held without spending once its window is full,
so the book alone does not count them). The dashboard, ``GET /api/budgets`` and
``/metrics`` ask it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from events.budget_codec import dumps_book, loads_book
from events.budgets import AnyBudgetEvent, Budget, BudgetBook, window_text
from projections.schema import timestamp

if TYPE_CHECKING:  # the store writes these rows: no import cycle at run time
    from projections.store import Store

Row = dict[str, Any]


def apply_budget(
    books: dict[str, BudgetBook], touched: dict[str, str], event: AnyBudgetEvent
) -> None:
    """Fold one budget event into its agent's book (pre-loaded in ``books``, else new);
    ``touched`` keeps, per agent, the time of its last event (its rows' ``updated_at``)."""
    book = books.get(event.agent)
    if book is None:
        book = books[event.agent] = BudgetBook()
    book.apply(event)
    touched[event.agent] = timestamp(event.occurred_at)


def book_of_row(row: Row) -> BudgetBook:
    """An agent's book from its ``budget_books`` row."""
    return loads_book(row["book"])


def book_row(agent: str, book: BudgetBook, at: str) -> Row:
    """An agent's ``budget_books`` row."""
    return {"agent": agent, "book": dumps_book(book), "updated_at": at}


def budget_rows(book: BudgetBook, at: str) -> list[Row]:
    """One ``budgets`` row per budget the book holds, in (agent, scope) order."""
    rows = []
    for (agent, channel), budget in sorted(
        book.budgets.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
    ):
        newest = max(budget.windows) if budget.windows else None
        use = None if newest is None else budget.windows[newest]
        rows.append(
            {
                "agent": agent,
                "scope": channel or "",
                "channel": channel,
                "budget_limit": budget.limit,
                "window_s": budget.window_s,
                "anchor": timestamp(budget.anchor),
                "window_start": None if newest is None else timestamp(newest),
                "granted": 0 if use is None else len(use.granted),
                "allowance": 0 if use is None else use.allowance,
                "over": len(budget.over - budget.granted.keys()),
                "updated_at": at,
            }
        )
    return rows


# Asking ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetUse:
    """One budget as of ``now``: its terms, what its current window has used, what waits."""

    agent: str
    channel: str | None  # None: every channel of the agent
    limit: int  # deliveries per window
    window: str  # ``1h``
    window_s: int
    window_start: str
    resets_at: str  # the current window's end
    used: int  # deliveries granted in the current window
    allowed: int  # the limit plus what releases added to this window
    held: int  # PENDING deliveries waiting over_budget under this budget


def budget_use(store: Store, now: datetime) -> list[BudgetUse]:
    """Every budget as of ``now``, by agent then channel (every channel first)."""
    budgets = store.rows(
        "SELECT agent, scope, channel, budget_limit, window_s, anchor, window_start, "
        "granted, allowance FROM budgets ORDER BY agent, scope"
    )
    if not budgets:
        return []
    held = store.rows(
        "SELECT agent, channel, COUNT(*) AS n FROM deliveries WHERE waiting = 'over_budget' "
        "GROUP BY agent, channel"
    )
    return uses(budgets, held, now)


def uses(budgets: list[Row], held: list[Row], now: datetime) -> list[BudgetUse]:
    """``budget_use`` from its rows (pure): a held delivery counts under its channel's
    budget if its agent has one, else under the agent's every-channel budget (rule 1)."""
    scopes = {(r["agent"], r["scope"]) for r in budgets}
    waiting: dict[tuple[str, str], int] = {}
    for r in held:
        scope = r["channel"] if (r["agent"], r["channel"]) in scopes else ""
        waiting[(r["agent"], scope)] = waiting.get((r["agent"], scope), 0) + int(r["n"])
    found = []
    for r in budgets:
        window_s = int(r["window_s"])
        anchor = datetime.fromisoformat(r["anchor"])
        terms = Budget(r["agent"], r["channel"], int(r["budget_limit"]), window_s, anchor)
        start = terms.window_of(now)
        newest = r["window_start"]
        # Nothing spent or released since this window began: it has used nothing. (A clock
        # behind the workers' may see a newer window: its counts are the nearest answer.)
        current = newest is not None and newest >= timestamp(start)
        used = int(r["granted"]) if current else 0
        allowance = int(r["allowance"]) if current else 0
        found.append(
            BudgetUse(
                agent=r["agent"],
                channel=r["channel"],
                limit=terms.limit,
                window=window_text(window_s),
                window_s=window_s,
                window_start=timestamp(start),
                resets_at=timestamp(start + timedelta(seconds=window_s)),
                used=used,
                allowed=terms.limit + allowance,
                held=waiting.get((r["agent"], r["scope"]), 0),
            )
        )
    return found


def budget_report(store: Store, now: datetime) -> dict[str, Any]:
    """``budget_use`` as JSON-compatible data (the body of ``GET /api/budgets``), from one
    consistent snapshot."""
    store.begin_read()
    try:
        found = budget_use(store, now)
    finally:
        store.rollback()
    return {"now": timestamp(now), "budgets": [asdict(b) for b in found]}


def has_budget(store: Store, agent: str, channel: str | None) -> bool:
    """Whether the projection knows a budget of ``agent`` on ``channel`` (None: every
    channel)."""
    rows = store.rows(
        "SELECT agent FROM budgets WHERE agent = ? AND scope = ?", (agent, channel or "")
    )
    return bool(rows)
