"""Endpoint health: per endpoint, how its attempts end, how long its deliveries take, what
waits for it; and what each agent has held over its budget. Asked by the dashboard
(``GET /api/health`` and its panel) and ``/metrics`` alike.

An endpoint is the registry's (``endpoints`` table), else a configured webhook prefix
(``LEDGER_CHANNELS__WEBHOOK_ENDPOINTS``), else what a delivery's recipient says: a webhook's
origin (scheme, host, port), another channel's recipient itself. A webhook recipient
belongs to the longest registered (then configured) prefix covering it, the rule
``streams/channels/endpoints.py`` applies for signing (projections/endpoint_owners.py).

The tables are read with a few ``GROUP BY channel, recipient`` queries (their rows grow
with the distinct recipients, not with the deliveries) and merged here: ratios as counts,
latencies as histograms, so an endpoint's p50/p99 is a histogram quantile (linear within
a bucket, as Prometheus' ``histogram_quantile``), not an exact order statistic.

Nothing here reads the clock: ``now`` is the caller's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from projections.endpoint_owners import EndpointOwners
from projections.fold import Row
from projections.queries import AggregateCache, seconds_between
from projections.schema import DELIVERIES, ENDPOINTS, timestamp
from projections.store import Store

WINDOW = timedelta(hours=1)
WINDOWS: tuple[str, ...] = ("1h", "all")
# Upper bounds (seconds) of the per-endpoint latency histogram; the last bucket is open.
LATENCY_BOUNDS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400,
)  # fmt: skip
QUANTILES: tuple[float, ...] = (0.5, 0.99)
# Endpoints listed by ``GET /api/health`` unless asked otherwise, and labelled in
# ``/metrics``: the busiest (attempts ended, plus deliveries pending), the rest summed under
# ``OTHER`` so that a fleet of one-off recipients never becomes a fleet of series.
SHOWN = 50
METRIC_ENDPOINTS = 20
OTHER = "(other)"
# The breaker's column in the registry's table (projections/schema.py, events/endpoints.py
# ``EndpointState.circuit``: closed, open, half_open).
BREAKER_COLUMNS: tuple[str, ...] = ("circuit",)
CLOSED = "closed"
SUCCESS = ("SENT", "CONFIRMED")

_DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED_DOT = re.compile("%2e", re.IGNORECASE)


@dataclass(frozen=True)
class Ratio:
    """Attempts that reached an outcome in a window, and how many of them succeeded
    (SENT or CONFIRMED); ``ratio`` is None when none ended."""

    finished: int = 0
    succeeded: int = 0

    @property
    def ratio(self) -> float | None:
        """``succeeded / finished``, rounded to 4 places; None for no attempts."""
        return None if not self.finished else round(self.succeeded / self.finished, 4)

    def __add__(self, other: Ratio) -> Ratio:
        return Ratio(self.finished + other.finished, self.succeeded + other.succeeded)


@dataclass(frozen=True)
class Latency:
    """Requested-to-confirmed seconds of the confirmed deliveries in a window."""

    count: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True)
class EndpointHealth:
    """One endpoint's health as of the report's ``now``."""

    endpoint: str  # the registry's id, the configured prefix, or the recipient (redacted)
    channel: str
    source: str  # registry | settings | recipient | other
    state: str  # active | paused | disabled (the registry's; active otherwise)
    breaker: str  # closed | open | half_open ... (the breaker's column; closed without it)
    success: dict[str, float | None]  # window -> ratio
    attempts: dict[str, int]  # window -> attempts that reached an outcome
    latency: dict[str, Latency]  # window -> p50/p99
    pending: int
    waiting: dict[str, int]  # reason -> PENDING deliveries held for it
    traffic: int  # attempts ended (all time) plus pending: the ranking


@dataclass(frozen=True)
class AgentBudget:
    """One agent: deliveries it asked for in the last hour, and those held over budget."""

    agent: str
    requested_1h: int
    held: int


@dataclass(frozen=True)
class HealthReport:
    """Every endpoint's health (the busiest ``limit``, and the rest summed as ``OTHER``)
    and the agents' budget holds, as of ``now``."""

    now: str
    endpoints: list[EndpointHealth]
    endpoints_total: int
    agents: list[AgentBudget] | None  # None: the projection has no agent column yet
    latency_bounds: list[float] = field(default_factory=lambda: list(LATENCY_BOUNDS))

    def to_json(self) -> dict[str, Any]:
        """JSON-compatible data (the body of ``GET /api/health``)."""
        return asdict(self)


# Reading the tables ---------------------------------------------------------------------


def health_rows(store: Store, now: datetime) -> dict[str, list[Row]]:
    """The rows a report is made of (one read of each question; cache them per minute)."""
    since = timestamp(now - WINDOW)
    ended = "COALESCE(a.finished_at, a.sent_at, a.updated_at)"
    good = f"a.outcome IN {SUCCESS!r}"
    # To the millisecond (the times' own precision): SQLite's julianday arithmetic puts an
    # exact 3 s a hair above 3, PostgreSQL's does not; rounded, both backends bucket alike.
    seconds = f"ROUND(CAST({seconds_between(store, 'created_at', 'confirmed_at')} AS NUMERIC), 3)"
    cases = " ".join(f"WHEN s <= {bound} THEN {i}" for i, bound in enumerate(LATENCY_BOUNDS))
    rows = {
        # Held deliveries make no attempt: only real ones are counted (events/waiting.py).
        "attempts": store.rows(
            f"SELECT d.channel, d.recipient, COUNT(*) AS finished, "  # noqa: S608 - constants
            f"SUM(CASE WHEN {good} THEN 1 ELSE 0 END) AS succeeded, "
            f"SUM(CASE WHEN {ended} >= ? THEN 1 ELSE 0 END) AS finished_1h, "
            f"SUM(CASE WHEN {good} AND {ended} >= ? THEN 1 ELSE 0 END) AS succeeded_1h "
            "FROM delivery_attempts a JOIN deliveries d ON d.idempotency_key = a.idempotency_key "
            "WHERE a.outcome <> 'CLAIMED' GROUP BY d.channel, d.recipient",
            (since, since),
        ),
        # MATERIALIZED: parse each pair of times once, not once per CASE branch.
        "latency": store.rows(
            f"WITH t AS MATERIALIZED (SELECT channel, recipient, {seconds} AS s, "  # noqa: S608
            "CASE WHEN confirmed_at >= ? THEN 1 ELSE 0 END AS recent FROM deliveries "
            "WHERE status = 'CONFIRMED') "
            f"SELECT channel, recipient, recent, CASE {cases} ELSE {len(LATENCY_BOUNDS)} END "
            "AS bucket, COUNT(*) AS n FROM t GROUP BY channel, recipient, recent, 4",
            (since,),
        ),
        # Covered by deliveries_pending_endpoint: the cost follows the pending rows only.
        "pending": store.rows(
            "SELECT channel, recipient, waiting, COUNT(*) AS n FROM deliveries "
            "WHERE status = 'PENDING' GROUP BY channel, recipient, waiting"
        ),
        "endpoints": store.rows("SELECT * FROM endpoints ORDER BY endpoint_id"),
    }
    if "agent" in DELIVERIES.column_names:
        rows["agents"] = store.rows(
            "SELECT agent, "
            "SUM(CASE WHEN status = 'PENDING' AND waiting = 'over_budget' THEN 1 ELSE 0 END) "
            "AS held, SUM(CASE WHEN created_at >= ? THEN 1 ELSE 0 END) AS requested_1h "
            "FROM deliveries WHERE (status = 'PENDING' AND waiting = 'over_budget') "
            "OR created_at >= ? GROUP BY agent ORDER BY agent",
            (since, since),
        )
    return rows


def endpoint_health(
    store: Store,
    now: datetime,
    configured: Iterable[str] = (),
    limit: int = SHOWN,
    cache: AggregateCache | None = None,
) -> HealthReport:
    """Every endpoint's health as of ``now`` (``configured``: the webhook prefixes of the
    settings), the busiest ``limit`` listed, from one consistent snapshot. With ``cache``
    the rows are read again only when the projection or the minute changes."""
    memo = cache or AggregateCache()
    store.begin_read()
    try:
        # The window starts on a whole minute: the same answer cached or not.
        minute = now.replace(second=0, microsecond=0)
        rows = memo.get(store, ("health", minute), lambda: health_rows(store, minute))
    finally:
        store.rollback()
    return health_report(rows, now, configured, limit)


# Merging them (pure: no I/O) ------------------------------------------------------------


@dataclass
class _Tally:
    channel: str
    source: str
    state: str = "active"
    breaker: str = CLOSED
    ratio: dict[str, Ratio] = field(default_factory=lambda: dict.fromkeys(WINDOWS, Ratio()))
    buckets: dict[str, list[int]] = field(
        default_factory=lambda: {w: [0] * (len(LATENCY_BOUNDS) + 1) for w in WINDOWS}
    )
    pending: int = 0
    waiting: dict[str, int] = field(default_factory=dict)

    def add(self, other: _Tally) -> None:
        for w in WINDOWS:
            self.ratio[w] += other.ratio[w]
            self.buckets[w] = [
                a + b for a, b in zip(self.buckets[w], other.buckets[w], strict=True)
            ]
        self.pending += other.pending
        for reason, n in other.waiting.items():
            self.waiting[reason] = self.waiting.get(reason, 0) + n

    @property
    def traffic(self) -> int:
        return self.ratio["all"].finished + self.pending

    def health(self, endpoint: str) -> EndpointHealth:
        return EndpointHealth(
            endpoint=endpoint,
            channel=self.channel,
            source=self.source,
            state=self.state,
            breaker=self.breaker,
            success={w: self.ratio[w].ratio for w in WINDOWS},
            attempts={w: self.ratio[w].finished for w in WINDOWS},
            latency={w: _latency(self.buckets[w]) for w in WINDOWS},
            pending=self.pending,
            waiting=dict(sorted(self.waiting.items())),
            traffic=self.traffic,
        )


def health_report(
    rows: Mapping[str, list[Row]],
    now: datetime,
    configured: Iterable[str] = (),
    limit: int = SHOWN,
) -> HealthReport:
    """The report of ``health_rows`` as of ``now``: rows merged per endpoint, the busiest
    ``limit`` listed (registry endpoints before unregistered ones at equal traffic) and the
    rest summed as one ``OTHER`` entry per channel."""
    owners = EndpointOwners(rows["endpoints"], configured)
    tallies = _registry_tallies(rows["endpoints"])

    def tally(channel: str, recipient: str) -> _Tally:
        name, source = owners.owner(channel, recipient)
        key = (channel, name)
        if key not in tallies:
            tallies[key] = _Tally(channel, source)
        return tallies[key]

    for r in rows["attempts"]:
        t = tally(r["channel"], r["recipient"])
        t.ratio["all"] += Ratio(int(r["finished"]), int(r["succeeded"] or 0))
        t.ratio["1h"] += Ratio(int(r["finished_1h"] or 0), int(r["succeeded_1h"] or 0))
    for r in rows["latency"]:
        t = tally(r["channel"], r["recipient"])
        n, bucket = int(r["n"]), int(r["bucket"])
        t.buckets["all"][bucket] += n
        if int(r["recent"]):
            t.buckets["1h"][bucket] += n
    for r in rows["pending"]:
        t = tally(r["channel"], r["recipient"])
        t.pending += int(r["n"])
        if r["waiting"] is not None:
            t.waiting[r["waiting"]] = t.waiting.get(r["waiting"], 0) + int(r["n"])
    ranked = sorted(
        tallies.items(),
        key=lambda kv: (-kv[1].traffic, kv[1].source != "registry", kv[0]),
    )
    shown = [t.health(name) for (_, name), t in ranked[:limit]]
    rest: dict[str, _Tally] = {}
    for (channel, _), t in ranked[limit:]:
        rest.setdefault(channel, _Tally(channel, "other")).add(t)
    shown += [t.health(OTHER) for _, t in sorted(rest.items())]
    agents = None
    if "agents" in rows:
        agents = [
            AgentBudget(
                agent=r["agent"] or "(unknown)",
                requested_1h=int(r["requested_1h"] or 0),
                held=int(r["held"] or 0),
            )
            for r in rows["agents"]
        ]
    return HealthReport(
        now=timestamp(now), endpoints=shown, endpoints_total=len(tallies), agents=agents
    )


def quantile(q: float, buckets: Sequence[int]) -> float | None:
    """The ``q`` quantile of a ``LATENCY_BOUNDS`` histogram (counts per bucket, not
    cumulative), linear within its bucket; the open last bucket answers its lower bound.
    None for an empty histogram."""
    total = sum(buckets)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            if i == len(LATENCY_BOUNDS):
                return LATENCY_BOUNDS[-1]
            lower = LATENCY_BOUNDS[i - 1] if i else 0.0
            return round(lower + (LATENCY_BOUNDS[i] - lower) * (rank - seen) / n, 3)
        seen += n
    return LATENCY_BOUNDS[-1]


def _latency(buckets: Sequence[int]) -> Latency:
    p50, p99 = (quantile(q, buckets) for q in QUANTILES)
    return Latency(count=sum(buckets), p50=p50, p99=p99)


def _registry_tallies(registry: list[Row]) -> dict[tuple[str, str], _Tally]:
    """A tally for every registry endpoint, with its state and breaker, traffic or not."""
    column = next((c for c in BREAKER_COLUMNS if c in ENDPOINTS.column_names), None)
    return {
        (r["channel"], r["endpoint_id"]): _Tally(
            r["channel"],
            "registry",
            state=r["state"],
            breaker=str(r.get(column) or CLOSED) if column else CLOSED,
        )
        for r in registry
    }
