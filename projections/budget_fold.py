"""Folding ``ledger.budgets`` into the projection's rows, by the book's own rule.

The rule is ``BudgetBook``'s (events/budgets.py, the one every worker applies): each
agent's book is read from ``budget_books``, given the batch's events in log order, and
written back with one ``budgets`` row per budget it holds (its terms and the counts of its
newest window). All of an agent's budget events share one partition, so they arrive in
order, and one agent's book never depends on another's. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any

from events.budget_codec import dumps_book, loads_book
from events.budgets import AnyBudgetEvent, BudgetBook
from projections.schema import timestamp

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
