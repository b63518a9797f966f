"""One agent's ``BudgetBook`` as compact JSON: the projection's ``budget_books.book``.

The projection folds ``ledger.budgets`` by the book's own rule (events/budgets.py), not a
copy of it in SQL: between batches it keeps each agent's book as this text, and reads it
back exactly (every window, key and count in log order, the releases already counted),
so a book folded in one batch or in many is the same book. Times as the tables' fixed-width
UTC text.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from events.budgets import Budget, BudgetBook, WindowUse

_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def _time(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def dumps_book(book: BudgetBook) -> str:
    """The book as JSON text (deterministic: the same book, the same text)."""
    budgets = [
        {
            "agent": b.agent,
            "channel": b.channel,
            "limit": b.limit,
            "window_s": b.window_s,
            "anchor": _time(b.anchor),
            "windows": [
                [_time(start), use.granted, use.over, use.allowance]
                for start, use in sorted(b.windows.items())
            ],
            "granted": [[key, _time(start)] for key, start in b.granted.items()],
            "over": sorted(b.over),
        }
        for _, b in sorted(book.budgets.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
    ]
    data: dict[str, Any] = {
        "budgets": budgets,
        "applied": book.applied,
        "released": sorted(str(r) for r in book.released),
    }
    return _ENCODER.encode(data)


def loads_book(text: str) -> BudgetBook:
    """The book ``dumps_book`` wrote."""
    data = json.loads(text)
    book = BudgetBook()
    book.applied = int(data["applied"])
    book.released = {UUID(r) for r in data["released"]}
    for b in data["budgets"]:
        budget = Budget(
            b["agent"], b["channel"], int(b["limit"]), int(b["window_s"]), _at(b["anchor"])
        )
        for start, granted, over, allowance in b["windows"]:
            budget.windows[_at(start)] = WindowUse(list(granted), list(over), int(allowance))
        budget.granted = {key: _at(start) for key, start in b["granted"]}
        budget.over = set(b["over"])
        book.budgets[(budget.agent, budget.channel)] = budget
    return book


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)
