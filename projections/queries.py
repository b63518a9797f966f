"""The questions operators ask, answered from the ledger tables: written once, here, and
asked by the CLI (``ledger status``), the dashboard and ``/metrics`` alike.

Nothing here reads the clock: questions about time take ``now`` as a parameter.
Every answer is plain data (JSON-ready), in a stable order. A question that is both
listed and counted is one ``Question``: its table and its counter read the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from events.delivery_state import DeliveryState, Status
from events.redaction import redacted_data, redacted_url
from projections.fold import Row, state_of_row
from projections.schema import timestamp
from projections.slo import overdue, overdue_count
from projections.store import Store

T = TypeVar("T")

# The delivery states operators see, in the order of a delivery's life.
STATUSES: tuple[str, ...] = tuple(dict.fromkeys(status.public for status in Status))
# Upper bounds (seconds) of the latency histogram; the last bucket is open ("+Inf").
LATENCY_BUCKETS: tuple[float, ...] = (0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600)
HOURS_SHOWN = 24


@dataclass(frozen=True)
class Question:
    """One question about rows: which columns show an answer, which rows are its answer
    (``source``: FROM and WHERE, ``?`` placeholders), and in which order they are listed."""

    columns: str
    source: str
    order: str

    def rows(self, store: Store, params: Sequence[Any] = (), limit: int | None = None) -> list[Row]:
        """The answer's rows, in order; at most ``limit`` of them when given."""
        sql = f"SELECT {self.columns} {self.source} ORDER BY {self.order}"
        if limit is None:
            return store.rows(sql, params)
        return store.rows(f"{sql} LIMIT ?", (*params, limit))

    def count(self, store: Store, params: Sequence[Any] = ()) -> int:
        """How many rows the answer has."""
        return int(store.rows(f"SELECT COUNT(*) AS n {self.source}", params)[0]["n"])


# Past their SLO (projections/slo.py: the registered endpoint's SLO, else the request's).
OVERDUE_PENDING_COLUMNS = (
    "idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
    "next_attempt_at, created_at, slo_deadline"
)
OVERDUE_SENT_COLUMNS = (
    "idempotency_key, run_id, channel, recipient, attempts, provider_message_id, "
    "reconciliation, updated_at, slo_deadline"
)
UNKNOWN = Question(
    "idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
    "reconciliation, fencing_token, updated_at AS unknown_since",
    "FROM deliveries WHERE status = 'UNKNOWN'",
    "updated_at, idempotency_key",
)
CONFIRMED_WITHOUT_RESULT = Question(
    "d.idempotency_key, d.run_id, d.channel, d.recipient, d.provider_message_id, "
    "d.confirmed_at, r.status AS run_status",
    "FROM deliveries d LEFT JOIN agent_runs r ON r.run_id = d.run_id "
    "WHERE d.status = 'CONFIRMED' AND (r.run_id IS NULL OR r.status <> 'SUCCEEDED')",
    "d.confirmed_at, d.idempotency_key",
)
DUPLICATE_CONFLICTS = Question(
    "k.idempotency_key, k.run_id, d.channel, d.recipient, k.payload_hash, "
    "k.original_payload_hash, k.occurred_at, k.event_id",
    "FROM duplicate_keys k LEFT JOIN deliveries d ON d.idempotency_key = k.idempotency_key "
    "WHERE k.outcome = 'conflict'",
    "k.occurred_at, k.event_id",
)


def overdue_pending(store: Store, now: datetime, limit: int | None = None) -> list[Row]:
    """PENDING deliveries whose SLO deadline (requested_at + the SLO: the registered
    endpoint's where it sets one, else the request's) is before ``now``, most overdue
    first."""
    return overdue(store, "PENDING", OVERDUE_PENDING_COLUMNS, now, limit)


def overdue_sent(store: Store, now: datetime, limit: int | None = None) -> list[Row]:
    """SENT deliveries past their SLO deadline (as ``overdue_pending``): accepted, but
    not confirmed in time."""
    return overdue(store, "SENT", OVERDUE_SENT_COLUMNS, now, limit)


def unknown_awaiting_reconciliation(store: Store, limit: int | None = None) -> list[Row]:
    """UNKNOWN deliveries, the oldest first: nobody knows whether they left; a provider
    lookup must decide."""
    return UNKNOWN.rows(store, (), limit)


def confirmed_without_result(store: Store) -> list[Row]:
    """CONFIRMED deliveries whose run has no recorded success (no ``RunSucceeded``)."""
    return CONFIRMED_WITHOUT_RESULT.rows(store)


def duplicate_conflicts(store: Store) -> list[Row]:
    """The same idempotency key requested again with a different payload."""
    return DUPLICATE_CONFLICTS.rows(store)


def attempts_by_channel(store: Store) -> list[Row]:
    """Attempts per channel and error class (``None``: no error), one row per pair.

    Summed over outcomes: an error class can end attempts in several ways (http_5xx is a
    RETRY until the policy is exhausted, then FAILED), and a reader of "attempts by
    channel and error class" (the chart, the ``ledger_attempts`` series) takes one row per
    pair as the whole count.
    """
    return store.rows(
        "SELECT channel, error_class, COUNT(*) AS attempts FROM delivery_attempts "
        "GROUP BY channel, error_class ORDER BY channel, COALESCE(error_class, '')"
    )


def failed_attempts(attempts: list[Row]) -> int:
    """Attempts with an error, from ``attempts_by_channel``'s answer."""
    return sum(int(r["attempts"]) for r in attempts if r["error_class"] is not None)


def overdue_counts(store: Store, now: datetime) -> dict[str, int]:
    """How many deliveries are past their SLO at ``now``, pending and sent."""
    return {
        "overdue_pending": overdue_count(store, "PENDING", now),
        "overdue_sent": overdue_count(store, "SENT", now),
    }


def attention_counts(store: Store) -> dict[str, int]:
    """How many rows each worrying question that does not depend on ``now`` finds."""
    return {
        "unknown": UNKNOWN.count(store),
        "confirmed_without_result": CONFIRMED_WITHOUT_RESULT.count(store),
        "duplicate_conflicts": DUPLICATE_CONFLICTS.count(store),
        "failed_attempts": failed_attempts(attempts_by_channel(store)),
    }


# Operator actions (dashboard) ----------------------------------------------------------
#
# What an operator may act on (the FAILED table beside the UNKNOWN one), the delivery an
# action is built from (the worker's fold state, as the projection holds it), and what
# operators did to a run's deliveries (its timeline).

FAILED = Question(
    "idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
    "fencing_token, redrives, settled_by, failed_at",
    "FROM deliveries WHERE status = 'FAILED'",
    "failed_at DESC, idempotency_key",
)


def failed_deliveries(store: Store, limit: int | None = None) -> list[Row]:
    """FAILED deliveries, the latest first: nothing left, and nothing will unless an
    operator redrives them."""
    return FAILED.rows(store, (), limit)


def delivery_state(store: Store, key: str) -> DeliveryState | None:
    """Delivery ``key``'s current fold state in the projection (None: never requested)."""
    found = store.rows("SELECT * FROM deliveries WHERE idempotency_key = ?", (key,))
    return state_of_row(found[0]) if found else None


def operator_actions(store: Store, run_id: str, keys: Sequence[str] | None = None) -> list[Row]:
    """The operator actions on ``run_id``'s deliveries (those of ``keys`` only, when
    given), applied or refused, in the order they happened."""
    sql = "SELECT * FROM operator_actions WHERE run_id = ?"
    if keys is None:
        return store.rows(f"{sql} ORDER BY occurred_at, event_id", (run_id,))
    if not keys:
        return []
    marks = ", ".join("?" * len(keys))
    return store.rows(
        f"{sql} AND idempotency_key IN ({marks}) ORDER BY occurred_at, event_id",
        (run_id, *keys),
    )


# The backlog -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelBacklog:
    """PENDING deliveries of one channel as of ``now``."""

    channel: str
    pending: int
    oldest_requested_at: str
    oldest_age_seconds: float


@dataclass(frozen=True)
class Backlog:
    """Every PENDING delivery as of ``now``, late or not: a burst shows here at once,
    long before any of it passes its SLO. Ages are ``now`` (the reader's clock) less the
    projection's request times; ``oldest_*`` are None and 0 when nothing is pending."""

    pending_now: int
    oldest_requested_at: str | None
    oldest_age_seconds: float
    by_channel: list[ChannelBacklog] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The backlog as JSON-compatible data."""
        return asdict(self)


PENDING_BY_CHANNEL = (
    "SELECT channel, COUNT(*) AS pending, MIN(created_at) AS oldest FROM deliveries "
    "WHERE status = 'PENDING' GROUP BY channel ORDER BY channel"
)


def pending_by_channel(store: Store) -> list[Row]:
    """PENDING deliveries per channel: how many, and the oldest request time (no clock).

    Indexed: ``deliveries_pending`` (status, channel, created_at) covers it, so the cost
    grows with the pending rows only, never with the settled ones.
    """
    return store.rows(PENDING_BY_CHANNEL)


def backlog_at(rows: list[Row], now: datetime) -> Backlog:
    """The backlog of ``pending_by_channel`` rows as of ``now`` (pure: no I/O)."""
    channels = [
        ChannelBacklog(
            channel=r["channel"],
            pending=int(r["pending"]),
            oldest_requested_at=r["oldest"],
            oldest_age_seconds=age_seconds(r["oldest"], now),
        )
        for r in rows
    ]
    if not channels:
        return Backlog(pending_now=0, oldest_requested_at=None, oldest_age_seconds=0.0)
    oldest = min(c.oldest_requested_at for c in channels)  # fixed-width text: time order
    return Backlog(
        pending_now=sum(c.pending for c in channels),
        oldest_requested_at=oldest,
        oldest_age_seconds=age_seconds(oldest, now),
        by_channel=channels,
    )


def pending_backlog(store: Store, now: datetime) -> Backlog:
    """Pending now, the age of the oldest pending delivery, and both per channel."""
    return backlog_at(pending_by_channel(store), now)


def age_seconds(stored: str, now: datetime) -> float:
    """Seconds from a stored time to ``now``, never negative (a producer's clock ahead of
    the reader's makes a fresh request look a little younger than zero)."""
    then = datetime.fromisoformat(stored.replace("Z", "+00:00"))
    return round(max(0.0, (now - then).total_seconds()), 3)


# Operators' actions (events/operator.py) --------------------------------------------

# A resolve's outcomes, and what became of an action; every one is listed, zeros included.
RESOLVE_OUTCOMES: tuple[str, ...] = ("delivered", "not_delivered", "abandoned")
ACTION_RESULTS: tuple[str, ...] = ("applied", "refused")
# The UNKNOWN deliveries and since when each has been UNKNOWN: the current attempt's
# ``unknown_at``, not the row's ``updated_at``, which every lookup moves on.
UNKNOWN_SINCE = (
    "SELECT COUNT(*) AS n, MIN(COALESCE(a.unknown_at, d.updated_at)) AS since "
    "FROM deliveries d LEFT JOIN delivery_attempts a "
    "ON a.idempotency_key = d.idempotency_key AND a.attempt = d.attempts "
    "WHERE d.status = 'UNKNOWN'"
)


@dataclass(frozen=True)
class OperatorCounts:
    """What operators did, and what waits for one, as of ``now``: deliveries an operator
    settled, by the resolve's outcome (applied actions only); redrives, applied or refused;
    the UNKNOWN deliveries now, and the age of the oldest (0 and None when there is none)."""

    settled: dict[str, int]
    redrives: dict[str, int]
    unknown_now: int
    oldest_unknown_since: str | None
    oldest_unknown_age_seconds: float


def operator_tallies(store: Store) -> dict[str, Any]:
    """The operator counts that do not depend on ``now`` (one read of each table)."""
    settled = dict.fromkeys(RESOLVE_OUTCOMES, 0)
    redrives = dict.fromkeys(ACTION_RESULTS, 0)
    for r in store.rows(
        "SELECT action, outcome, result, COUNT(*) AS n FROM operator_actions "
        "GROUP BY action, outcome, result"
    ):
        if r["action"] == "redrive" and r["result"] in redrives:
            redrives[r["result"]] += int(r["n"])
        elif r["result"] == "applied" and r["outcome"] in settled:
            settled[r["outcome"]] += int(r["n"])
    unknown = store.rows(UNKNOWN_SINCE)[0]
    return {
        "settled": settled,
        "redrives": redrives,
        "unknown_now": int(unknown["n"]),
        "oldest_unknown_since": unknown["since"],
    }


def operator_counts_at(tallies: dict[str, Any], now: datetime) -> OperatorCounts:
    """``operator_tallies`` as of ``now`` (pure: no I/O)."""
    since = tallies["oldest_unknown_since"]
    return OperatorCounts(
        settled=dict(tallies["settled"]),
        redrives=dict(tallies["redrives"]),
        unknown_now=tallies["unknown_now"],
        oldest_unknown_since=since,
        oldest_unknown_age_seconds=0.0 if since is None else age_seconds(since, now),
    )


def operator_counts(store: Store, now: datetime) -> OperatorCounts:
    """Operator-settled deliveries by outcome, redrives by result, and the age of the
    oldest unresolved UNKNOWN as of ``now``."""
    return operator_counts_at(operator_tallies(store), now)


# Totals and distributions -----------------------------------------------------------


def deliveries_by_status(store: Store) -> dict[str, int]:
    """How many deliveries are in each state (every state listed, zeros included)."""
    found = {
        r["status"]: r["n"]
        for r in store.rows("SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status")
    }
    return {status: int(found.get(status, 0)) for status in STATUSES}


def seconds_between(store: Store, start: str, end: str) -> str:
    """SQL for ``end - start`` in seconds over our fixed-width UTC text times."""
    if store.placeholder == "?":  # SQLite
        return f"((julianday({end}) - julianday({start})) * 86400.0)"
    return f"EXTRACT(EPOCH FROM (CAST({end} AS timestamp) - CAST({start} AS timestamp)))"


def latency(store: Store) -> dict[str, Any]:
    """Requested-to-confirmed seconds of CONFIRMED deliveries, per ``LATENCY_BUCKETS``
    bucket (not cumulative), with their count and sum."""
    seconds = seconds_between(store, "created_at", "confirmed_at")
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
    return {
        "bounds": list(LATENCY_BUCKETS),
        "counts": counts,
        "count": sum(counts),
        "sum_seconds": round(total, 3),
    }


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


def runs_by_status(store: Store) -> dict[str, int]:
    """How many agent runs are in each execution state (states with none left out)."""
    return {
        r["status"]: int(r["n"])
        for r in store.rows("SELECT status, COUNT(*) AS n FROM agent_runs GROUP BY status")
    }


def sends_by_outcome(store: Store) -> list[tuple[str, str, int]]:
    """(channel, outcome, attempts) of the attempts that reached an outcome."""
    return [
        (r["channel"], r["outcome"], int(r["n"]))
        for r in store.rows(
            "SELECT channel, outcome, COUNT(*) AS n FROM delivery_attempts "
            "WHERE outcome <> 'CLAIMED' GROUP BY channel, outcome ORDER BY channel, outcome"
        )
    ]


def open_leases(store: Store) -> int:
    """Deliveries whose current attempt is claimed and has no outcome yet."""
    return int(
        store.rows(
            "SELECT COUNT(*) AS n FROM deliveries d JOIN delivery_attempts a "
            "ON a.idempotency_key = d.idempotency_key AND a.attempt = d.attempts "
            "WHERE d.status = 'PENDING' AND a.outcome = 'CLAIMED'"
        )[0]["n"]
    )


def awaiting_retry(store: Store) -> int:
    """PENDING deliveries with a retry scheduled."""
    return int(
        store.rows(
            "SELECT COUNT(*) AS n FROM deliveries "
            "WHERE status = 'PENDING' AND next_attempt_at IS NOT NULL"
        )[0]["n"]
    )


def consumed_offsets(store: Store) -> dict[str, int]:
    """Per topic, the sum over partitions of the next offset the projection will read."""
    return {
        r["topic"]: int(r["n"])
        for r in store.rows(
            "SELECT topic, SUM(next_offset) AS n FROM projection_offsets GROUP BY topic"
        )
    }


@dataclass
class AggregateCache:
    """The answers that do not depend on ``now``, kept until the projection changes.

    Every committed batch advances ``projection_offsets``, so the sum of the stored
    offsets identifies the projection's content exactly: while it is unchanged, the
    full-table aggregates (latency, attempts, confirmed without result) are too.
    """

    fingerprint: tuple[Any, ...] | None = None
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, store: Store, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
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
        answer: T = self.values[name]
        return answer


def held_over_budget(store: Store, agent: str | None = None) -> list[Row]:
    """Per agent (or for ``agent``), its deliveries held because it spent its send budget
    (events/budgets.py): how many, and since when the oldest waits."""
    select = "SELECT agent, COUNT(*) AS n, MIN(waiting_since) AS oldest FROM deliveries "
    group = " GROUP BY agent ORDER BY agent"
    if agent is None:
        rows = store.rows(select + "WHERE waiting = 'over_budget'" + group)
    else:
        rows = store.rows(select + "WHERE waiting = 'over_budget' AND agent = ?" + group, (agent,))
    return [{"agent": r["agent"], "held": int(r["n"]), "oldest_since": r["oldest"]} for r in rows]


# Every question at once (``ledger status``) ------------------------------------------


@dataclass(frozen=True)
class StatusReport:
    """Every dashboard question at once, as of ``now``."""

    now: str
    backlog: Backlog
    overdue_pending: list[Row]
    overdue_sent: list[Row]
    unknown: list[Row]
    confirmed_without_result: list[Row]
    duplicate_conflicts: list[Row]
    attempts_by_channel: list[Row]
    operators: OperatorCounts
    over_budget: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-compatible data."""
        return asdict(self)

    @property
    def needs_attention(self) -> bool:
        """True when any question has a worrying answer (a backlog within its SLO is not)."""
        return bool(
            self.overdue_pending
            or self.overdue_sent
            or self.unknown
            or self.confirmed_without_result
            or self.duplicate_conflicts
        )


def status_report(store: Store, now: datetime) -> StatusReport:
    """Answer every dashboard question as of ``now``, URLs redacted (``events.redaction``):
    the report is for showing, and events in the log may carry credentials in recipients."""
    report = StatusReport(
        now=timestamp(now),
        backlog=pending_backlog(store, now),
        overdue_pending=overdue_pending(store, now),
        overdue_sent=overdue_sent(store, now),
        unknown=unknown_awaiting_reconciliation(store),
        confirmed_without_result=confirmed_without_result(store),
        duplicate_conflicts=duplicate_conflicts(store),
        attempts_by_channel=attempts_by_channel(store),
        operators=operator_counts(store, now),
        over_budget=held_over_budget(store),
    )
    shown: dict[str, Any] = redacted_data(report.to_json())
    # The backlog and the operator counts hold names, counts and times only: nothing to
    # redact.
    return StatusReport(**{**shown, "backlog": report.backlog, "operators": report.operators})


# Operator selections ---------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which deliveries an operator's bulk action is for: every given selector must match
    (AND). ``keys`` empty: any key; ``statuses`` empty: any state; ``since``/``until``
    bound the request time (``created_at``), ``until`` exclusive."""

    keys: tuple[str, ...] = ()
    run_id: str | None = None
    channel: str | None = None
    recipient: str | None = None
    statuses: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None

    def where(self, *, statuses: bool = True) -> tuple[str, list[Any]]:
        """The WHERE clause (``?`` placeholders) and its parameters; without the state
        selector when ``statuses`` is False."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.keys:
            clauses.append(f"idempotency_key IN ({', '.join('?' * len(self.keys))})")
            params.extend(self.keys)
        for column, value in (
            ("run_id", self.run_id),
            ("channel", self.channel),
            ("recipient", self.recipient),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if statuses and self.statuses:
            clauses.append(f"status IN ({', '.join('?' * len(self.statuses))})")
            params.extend(self.statuses)
        if self.since is not None:
            clauses.append("created_at >= ?")
            params.append(timestamp(self.since))
        if self.until is not None:
            clauses.append("created_at < ?")
            params.append(timestamp(self.until))
        return " AND ".join(clauses) or "1 = 1", params

    def scope(self) -> str:
        """The selection as the operator events' ``scope`` text (URLs redacted)."""
        parts = [f"keys={len(self.keys)}"] if self.keys else []
        for name, value in (
            ("run", self.run_id),
            ("channel", self.channel),
            ("recipient", None if self.recipient is None else redacted_url(self.recipient)),
        ):
            if value is not None:
                parts.append(f"{name}={value}")
        if self.statuses:
            parts.append("state=" + "+".join(self.statuses))
        if self.since is not None:
            parts.append(f"since={timestamp(self.since)}")
        if self.until is not None:
            parts.append(f"until={timestamp(self.until)}")
        return " ".join(parts)[:1000] or "all"


def selected_deliveries(store: Store, selection: Selection, limit: int) -> list[Row]:
    """The whole ``deliveries`` rows (their fold ``state`` included) the selection
    matches, oldest request first, at most ``limit`` of them."""
    where, params = selection.where()
    return store.rows(
        f"SELECT * FROM deliveries WHERE {where} "  # noqa: S608 - constant SQL, bound values
        "ORDER BY created_at, idempotency_key LIMIT ?",
        (*params, limit),
    )


def selected_count(store: Store, selection: Selection, *, status: str | None = None) -> int:
    """How many deliveries the selection matches; with ``status``, how many of them are in
    that state whatever the selection's own states (CONFIRMED: already settled)."""
    where, params = selection.where(statuses=status is None)
    if status is not None:
        where, params = f"{where} AND status = ?", [*params, status]
    sql = f"SELECT COUNT(*) AS n FROM deliveries WHERE {where}"  # noqa: S608 - constant SQL
    return int(store.rows(sql, params)[0]["n"])


def known_keys(store: Store, keys: Sequence[str]) -> set[str]:
    """Which of ``keys`` the projection has a delivery for."""
    if not keys:
        return set()
    marks = ", ".join("?" * len(keys))
    return {
        r["idempotency_key"]
        for r in store.rows(
            f"SELECT idempotency_key FROM deliveries WHERE idempotency_key IN ({marks})",  # noqa: S608
            list(keys),
        )
    }


ENDPOINTS = Question(
    "endpoint_id, channel, address, state, circuit, circuit_since, "
    "COALESCE(disabled_by, paused_by) AS stopped_by, "
    "COALESCE(disabled_reason, paused_reason) AS stopped_reason, "
    "COALESCE(disabled_at, paused_at) AS stopped_at, "
    "secrets, rotation_ends_at, rate_limit_per_s, slo_s, updated_at",
    "FROM endpoints",
    "endpoint_id",
)


def endpoints(store: Store, limit: int | None = None) -> list[Row]:
    """Every endpoint of the registry and its state (active, paused, disabled), its
    circuit breaker's (closed, open, half_open) and since when, with who stopped it, why
    and since when; how many secrets it has, never the secrets."""
    return ENDPOINTS.rows(store, (), limit)


def waiting_by_reason(store: Store) -> dict[str, int]:
    """PENDING deliveries held back, by why (events/waiting.py)."""
    rows = store.rows(
        "SELECT waiting, COUNT(*) AS n FROM deliveries "
        "WHERE status = 'PENDING' AND waiting IS NOT NULL GROUP BY waiting ORDER BY waiting",
        (),
    )
    return {str(r["waiting"]): int(r["n"]) for r in rows}
