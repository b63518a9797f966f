"""The dashboard's numbers, read from the ledger tables only (never processor state).

Everything here is bounded: counters are ``COUNT`` queries on indexed columns, tables
carry a row limit, charts are aggregates. ``now`` is always the caller's (the server's)
clock, so the same projection and the same ``now`` give the same page.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from projections.fold import Row
from projections.queries import Backlog, backlog_at, pending_by_channel
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
STATUSES = ("PENDING", "SENT", "UNKNOWN", "CONFIRMED", "FAILED")
# Upper bounds (seconds) of the latency histogram; the last bucket is open ("+Inf").
LATENCY_BUCKETS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
HOURS_SHOWN = 24


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
    limit: int
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


def overdue_count(store: Store, now: datetime, status: str = "PENDING") -> int:
    """Deliveries in ``status`` (PENDING or SENT) past their SLO deadline at ``now``."""
    return int(
        store.rows(
            "SELECT COUNT(*) AS n FROM deliveries WHERE status = ? AND slo_deadline < ?",
            (status, timestamp(now)),
        )[0]["n"]
    )


def counter_values(store: Store, now: datetime) -> dict[str, int]:
    """The counters as numbers (the same queries as ``projections.queries``, counted)."""
    one = store.rows
    return {
        "overdue_pending": overdue_count(store, now),
        "overdue_sent": overdue_count(store, now, "SENT"),
        "unknown": one("SELECT COUNT(*) AS n FROM deliveries WHERE status = 'UNKNOWN'")[0]["n"],
        "confirmed_without_result": one(
            "SELECT COUNT(*) AS n FROM deliveries d LEFT JOIN agent_runs r ON r.run_id = d.run_id "
            "WHERE d.status = 'CONFIRMED' AND (r.run_id IS NULL OR r.status <> 'SUCCEEDED')"
        )[0]["n"],
        "duplicate_conflicts": one(
            "SELECT COUNT(*) AS n FROM duplicate_keys WHERE outcome = 'conflict'"
        )[0]["n"],
        "failed_attempts": one(
            "SELECT COUNT(*) AS n FROM delivery_attempts WHERE error_class IS NOT NULL"
        )[0]["n"],
    }


def deliveries_by_status(store: Store) -> dict[str, int]:
    """How many deliveries are in each state (every state listed, zeros included)."""
    found = {
        r["status"]: r["n"]
        for r in store.rows("SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status")
    }
    return {status: int(found.get(status, 0)) for status in STATUSES}


def attempts_by_channel(store: Store) -> list[Row]:
    """Attempts per channel and error class (``None``: no error), summed over outcomes."""
    return store.rows(
        "SELECT channel, error_class, COUNT(*) AS attempts FROM delivery_attempts "
        "GROUP BY channel, error_class ORDER BY channel, COALESCE(error_class, '')"
    )


def _seconds_between(store: Store, start: str, end: str) -> str:
    """SQL for ``end - start`` in seconds over our fixed-width UTC text times."""
    if store.placeholder == "?":  # SQLite
        return f"((julianday({end}) - julianday({start})) * 86400.0)"
    return f"EXTRACT(EPOCH FROM (CAST({end} AS timestamp) - CAST({start} AS timestamp)))"


def latency(store: Store) -> dict[str, Any]:
    """Requested-to-confirmed seconds of CONFIRMED deliveries, as cumulative-free buckets."""
    seconds = _seconds_between(store, "created_at", "confirmed_at")
    cases = " ".join(f"WHEN s <= {bound} THEN {i}" for i, bound in enumerate(LATENCY_BUCKETS))
    # MATERIALIZED: parse each pair of times once, not once per CASE branch.
    rows = store.rows(
        f"WITH t AS MATERIALIZED (SELECT {seconds} AS s FROM deliveries "  # noqa: S608 - constants
        f"WHERE status = 'CONFIRMED') SELECT CASE {cases} ELSE {len(LATENCY_BUCKETS)} END "
        "AS bucket, COUNT(*) AS n, SUM(s) AS total FROM t GROUP BY 1"
    )
    counts = [0] * (len(LATENCY_BUCKETS) + 1)
    total = 0.0
    for row in rows:
        counts[int(row["bucket"])] = int(row["n"])
        total += float(row["total"] or 0.0)
    labels = [f"≤{_short(b)}" for b in LATENCY_BUCKETS] + [f">{_short(LATENCY_BUCKETS[-1])}"]
    return {
        "bounds": list(LATENCY_BUCKETS),
        "labels": labels,
        "counts": counts,
        "count": sum(counts),
        "sum_seconds": round(total, 3),
    }


def _short(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    if seconds >= 60:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def by_hour(store: Store, now: datetime) -> list[Row]:
    """Deliveries requested in each of the last 24 hours before ``now``, by current state."""
    start = (now - timedelta(hours=HOURS_SHOWN - 1)).replace(minute=0, second=0, microsecond=0)
    rows = store.rows(
        "SELECT SUBSTR(created_at, 1, 13) AS hour, status, COUNT(*) AS n FROM deliveries "
        "WHERE created_at >= ? GROUP BY SUBSTR(created_at, 1, 13), status",
        (timestamp(start),),
    )
    table: dict[str, dict[str, int]] = {}
    for i in range(HOURS_SHOWN):
        hour = timestamp(start + timedelta(hours=i))[:13]
        table[hour] = dict.fromkeys(STATUSES, 0)
    for row in rows:
        if row["hour"] in table:
            table[row["hour"]][row["status"]] = int(row["n"])
    return [{"hour": hour + ":00Z", **counts} for hour, counts in table.items()]


def unknown_rows(store: Store, limit: int) -> list[Row]:
    """The oldest UNKNOWN deliveries first, at most ``limit``."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
        "reconciliation, updated_at AS unknown_since FROM deliveries "
        "WHERE status = 'UNKNOWN' ORDER BY updated_at, idempotency_key LIMIT ?",
        (limit,),
    )


def overdue_sent_rows(store: Store, now: datetime, limit: int) -> list[Row]:
    """SENT deliveries past their SLO deadline, most overdue first, at most ``limit``."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, provider_message_id, "
        "reconciliation, updated_at, slo_deadline FROM deliveries "
        "WHERE status = 'SENT' AND slo_deadline < ? "
        "ORDER BY slo_deadline, idempotency_key LIMIT ?",
        (timestamp(now), limit),
    )


def overdue_rows(store: Store, now: datetime, limit: int) -> list[Row]:
    """PENDING deliveries past their SLO deadline, most overdue first, at most ``limit``."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
        "next_attempt_at, created_at, slo_deadline FROM deliveries "
        "WHERE status = 'PENDING' AND slo_deadline < ? "
        "ORDER BY slo_deadline, idempotency_key LIMIT ?",
        (timestamp(now), limit),
    )


@dataclass
class AggregateCache:
    """The aggregates that do not depend on ``now``, kept until the projection changes.

    Every committed batch advances ``projection_offsets``, so the sum of the stored
    offsets identifies the projection's content exactly: while it is unchanged, the
    full-table aggregates (latency, attempts, confirmed without result) are too.
    """

    fingerprint: tuple[Any, ...] | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, store: Store, key: tuple[Any, ...], compute: Any) -> Any:
        """The cached value for ``key`` in the current projection, computing it if needed."""
        found = store.rows(
            "SELECT COUNT(*) AS n, COALESCE(SUM(next_offset), 0) AS o FROM projection_offsets"
        )[0]
        fingerprint = (found["n"], found["o"])
        if fingerprint != self.fingerprint:
            self.fingerprint, self.values = fingerprint, {}
        name = repr(key)
        if name not in self.values:
            self.values[name] = compute()
        return self.values[name]


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
        values = dict(memo.get(store, ("counters",), lambda: counter_values(store, now)))
        # Only the overdue counts depend on now; the others are the projection's.
        values["overdue_pending"] = overdue_count(store, now)
        values["overdue_sent"] = overdue_count(store, now, "SENT")
        # The pending rows change only with the projection; their ages, with now.
        pending = memo.get(store, ("pending",), lambda: pending_by_channel(store))
        result = Overview(
            now=timestamp(now),
            counters=[
                Counter(n, titles[n], values[n], limits[n], level(values[n], limits[n]))
                for n in titles
            ],
            backlog=backlog_at(pending, now),
            deliveries_by_status=memo.get(store, ("status",), lambda: deliveries_by_status(store)),
            attempts_by_channel=memo.get(store, ("attempts",), lambda: attempts_by_channel(store)),
            latency=memo.get(store, ("latency",), lambda: latency(store)),
            by_hour=memo.get(store, ("by_hour", hour), lambda: by_hour(store, now)),
            unknown=memo.get(store, ("unknown", limit), lambda: unknown_rows(store, limit)),
            overdue_pending=overdue_rows(store, now, limit),
            overdue_sent=overdue_sent_rows(store, now, limit),
            limit=limit,
        )
    finally:
        store.rollback()
    return result
