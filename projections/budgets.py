"""Agents' send budgets in the projection: what each budget has used now (the rows are
projections/budget_fold.py's).

``budget_use`` answers, as of the caller's ``now``, per budget: the limit, the use of the
current window, when it resets, and how many deliveries are held over budget (those come
from the deliveries table: a delivery is held without spending once its window is full,
so the book alone does not count them). The dashboard, ``GET /api/budgets`` and
``/metrics`` ask it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from events.budgets import Budget, window_text
from projections.schema import timestamp
from projections.store import Store

Row = dict[str, Any]


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
