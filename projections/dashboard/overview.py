"""The dashboard page: which answers it shows, under which titles, in which colours.

The answers themselves are ``projections.queries`` (the CLI and ``/metrics`` ask the same
ones); here they are only arranged. Everything is bounded: counters are ``COUNT``
queries on indexed columns, tables carry a row limit, charts are aggregates. ``now`` is
always the caller's (the server's) clock, so the same projection and the same ``now``
give the same page.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from projections import queries
from projections.fold import Row
from projections.queries import AggregateCache, Backlog, OperatorCounts
from projections.schema import timestamp
from projections.store import Store

# The questions, in page order: (name, title, default threshold at which it is red).
COUNTERS: tuple[tuple[str, str, int], ...] = (
    ("overdue_pending", "pending past SLO", 1),
    ("overdue_sent", "sent past SLO, not confirmed", 1),
    ("unknown", "unknown, awaiting reconciliation", 1),
    ("confirmed_without_result", "confirmed, no execution result", 1),
    ("duplicate_conflicts", "duplicate-key conflicts", 1),
    ("failed_attempts", "attempts with an error", 25),
)


@dataclass(frozen=True)
class Counter:
    """One coloured counter: green at 0, amber below its threshold, red at or above it."""

    name: str
    title: str
    value: int
    threshold: int
    level: str


@dataclass
class Overview:
    """Everything the dashboard page shows, as of ``now``."""

    now: str
    counters: list[Counter]
    backlog: Backlog
    deliveries_by_status: dict[str, int]
    attempts_by_channel: list[Row]
    latency: dict[str, Any]
    by_hour: list[Row]
    unknown: list[Row]
    overdue_pending: list[Row]
    overdue_sent: list[Row]
    failed: list[Row]
    limit: int
    # What operators settled and redrove, and the oldest UNKNOWN's age (beside the counters).
    operators: OperatorCounts
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-compatible data (the body of ``GET /api/overview``)."""
        return asdict(self)


def level(value: int, threshold: int) -> str:
    """``ok`` (zero), ``warn`` (below the threshold) or ``alert`` (at or above it)."""
    if value <= 0:
        return "ok"
    return "alert" if value >= threshold else "warn"


def thresholds(configured: dict[str, int]) -> dict[str, int]:
    """Every counter's threshold: the configured one, else the default."""
    return {name: configured.get(name, default) for name, _, default in COUNTERS}


def latency_labels(bounds: list[float]) -> list[str]:
    """The histogram's bucket labels: ``≤5s`` ... and the open last one, ``>1h``."""
    return [f"≤{_short(b)}" for b in bounds] + [f">{_short(bounds[-1])}"]


def _short(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    if seconds >= 60:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def overview(
    store: Store,
    now: datetime,
    configured: dict[str, int] | None = None,
    limit: int = 50,
    cache: AggregateCache | None = None,
) -> Overview:
    """Every number of the dashboard page, from one consistent snapshot of the tables."""
    limits = thresholds(configured or {})
    titles = {name: title for name, title, _ in COUNTERS}
    memo = cache or AggregateCache()
    hour = timestamp(now)[:13]
    store.begin_read()
    try:
        # Only the overdue counts depend on now; the others are the projection's.
        values = {
            **memo.get(store, ("counters",), lambda: queries.attention_counts(store)),
            **queries.overdue_counts(store, now),
        }
        # The pending rows change only with the projection; their ages, with now.
        pending = memo.get(store, ("pending",), lambda: queries.pending_by_channel(store))
        tallies = memo.get(store, ("operators",), lambda: queries.operator_tallies(store))
        latency = memo.get(store, ("latency",), lambda: queries.latency(store))
        result = Overview(
            now=timestamp(now),
            counters=[
                Counter(n, titles[n], values[n], limits[n], level(values[n], limits[n]))
                for n in titles
            ],
            backlog=queries.backlog_at(pending, now),
            deliveries_by_status=memo.get(
                store, ("status",), lambda: queries.deliveries_by_status(store)
            ),
            attempts_by_channel=memo.get(
                store, ("attempts",), lambda: queries.attempts_by_channel(store)
            ),
            latency={**latency, "labels": latency_labels(latency["bounds"])},
            by_hour=memo.get(store, ("by_hour", hour), lambda: queries.by_hour(store, now)),
            unknown=memo.get(
                store,
                ("unknown", limit),
                lambda: queries.unknown_awaiting_reconciliation(store, limit),
            ),
            overdue_pending=queries.overdue_pending(store, now, limit),
            overdue_sent=queries.overdue_sent(store, now, limit),
            failed=memo.get(
                store, ("failed", limit), lambda: queries.failed_deliveries(store, limit)
            ),
            limit=limit,
            operators=queries.operator_counts_at(tallies, now),
        )
    finally:
        store.rollback()
    return result
