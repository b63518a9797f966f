"""The ledger tables: one portable definition for SQLite and PostgreSQL, and its version.

Every column is TEXT or INTEGER, and every time is fixed-width ISO-8601 UTC text
(``2026-01-02T03:04:05.000006Z``). That keeps one representation on both backends, so
a dump from SQLite and one from PostgreSQL compare byte for byte, and text order is
time order. Bump ``SCHEMA_VERSION`` whenever a table or a folding rule changes: a
projection is rebuilt from the log, never migrated by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

SCHEMA_VERSION = 10


@dataclass(frozen=True)
class Table:
    """A table: its columns (name, SQL type) in order, and its primary key."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        """Column names in definition order."""
        return tuple(name for name, _ in self.columns)

    def create_sql(self, native: Mapping[str, str]) -> str:
        """``CREATE TABLE``, with portable types (TEXT, INTEGER) mapped by ``native``."""
        cols = ",\n  ".join(f"{name} {_native(kind, native)}" for name, kind in self.columns)
        return f"CREATE TABLE {self.name} (\n  {cols},\n  PRIMARY KEY ({', '.join(self.key)})\n)"


AGENT_RUNS = Table(
    "agent_runs",
    (
        ("run_id", "TEXT NOT NULL"),
        ("status", "TEXT NOT NULL"),  # RUNNING | SUCCEEDED | FAILED | UNKNOWN
        ("agent", "TEXT"),
        ("result_hash", "TEXT"),
        ("error", "TEXT"),
        ("started_at", "TEXT"),
        ("finished_at", "TEXT"),
        ("events", "INTEGER NOT NULL"),
        ("created_at", "TEXT NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
        # Version 10: who published the run, the producer of its first execution event (the
        # agent an API key names: the API answers reads of a run to that agent's keys only).
        # ``agent`` above is what RunStarted says, and a run need not send one.
        ("producer", "TEXT"),
    ),
    ("run_id",),
)

DELIVERIES = Table(
    "deliveries",
    (
        ("idempotency_key", "TEXT NOT NULL"),
        ("run_id", "TEXT NOT NULL"),
        ("event_type", "TEXT NOT NULL"),
        ("channel", "TEXT NOT NULL"),
        ("recipient", "TEXT NOT NULL"),
        ("payload_hash", "TEXT NOT NULL"),
        ("slo_seconds", "INTEGER NOT NULL"),
        ("slo_deadline", "TEXT NOT NULL"),
        ("status", "TEXT NOT NULL"),  # PENDING | SENT | UNKNOWN | CONFIRMED | FAILED
        ("attempts", "INTEGER NOT NULL"),
        ("fencing_token", "INTEGER NOT NULL"),
        ("provider_message_id", "TEXT"),
        ("last_error_class", "TEXT"),
        ("reconciliation", "TEXT"),
        ("next_attempt_at", "TEXT"),
        ("requests", "INTEGER NOT NULL"),
        ("confirmed_at", "TEXT"),
        ("failed_at", "TEXT"),
        ("created_at", "TEXT NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
        # Version 3: the worker's fold state (events/state_codec.py), which the
        # columns above are derived from: one set of transition rules for both.
        ("state", "TEXT NOT NULL"),
        # Version 4: operator actions (events/operator.py): who settled it, if an
        # operator did, and how many redrives it had.
        ("settled_by", "TEXT"),
        ("redrives", "INTEGER NOT NULL"),
        # Version 5: why a PENDING delivery is held back before its claim
        # (events/waiting.py: paused, disabled, circuit_open, over_budget), and since when.
        ("waiting", "TEXT"),
        ("waiting_since", "TEXT"),
        # Version 8: who asked for it (the request's producer: the agent whose send budget
        # it counts against, events/budgets.py).
        ("agent", "TEXT"),
    ),
    ("idempotency_key",),
)

DELIVERY_ATTEMPTS = Table(
    "delivery_attempts",
    (
        ("idempotency_key", "TEXT NOT NULL"),
        ("attempt", "INTEGER NOT NULL"),
        ("run_id", "TEXT NOT NULL"),
        ("channel", "TEXT NOT NULL"),
        ("outcome", "TEXT NOT NULL"),  # CLAIMED | SENT | CONFIRMED | UNKNOWN | RETRY | FAILED
        ("worker_id", "TEXT"),
        ("fencing_token", "INTEGER"),
        ("claimed_at", "TEXT"),
        ("lease_expires_at", "TEXT"),
        ("sent_at", "TEXT"),
        ("http_status", "INTEGER"),
        ("provider_message_id", "TEXT"),
        ("error_class", "TEXT"),
        ("reason", "TEXT"),
        ("unknown_at", "TEXT"),
        ("reconciliation", "TEXT"),
        ("reconciled_at", "TEXT"),
        ("retry_scheduled_at", "TEXT"),
        ("retry_at", "TEXT"),
        ("confirmed_at", "TEXT"),
        ("failed_at", "TEXT"),
        ("finished_at", "TEXT"),  # the first outcome: confirmed, unknown, retry or failed
        ("created_at", "TEXT NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
    ),
    ("idempotency_key", "attempt"),
)

DUPLICATE_KEYS = Table(
    "duplicate_keys",
    (
        ("event_id", "TEXT NOT NULL"),
        ("idempotency_key", "TEXT NOT NULL"),
        ("run_id", "TEXT NOT NULL"),
        ("duplicate_event_id", "TEXT NOT NULL"),
        ("payload_hash", "TEXT NOT NULL"),
        ("original_payload_hash", "TEXT NOT NULL"),
        ("outcome", "TEXT NOT NULL"),  # deduplicated | conflict
        ("occurred_at", "TEXT NOT NULL"),
    ),
    ("event_id",),
)

# Version 4: every operator action read from the log, applied or refused (and why).
OPERATOR_ACTIONS = Table(
    "operator_actions",
    (
        ("event_id", "TEXT NOT NULL"),
        ("idempotency_key", "TEXT NOT NULL"),
        ("run_id", "TEXT NOT NULL"),
        ("action", "TEXT NOT NULL"),  # resolve | redrive
        ("outcome", "TEXT"),  # resolve: delivered | not_delivered | abandoned
        ("operator", "TEXT NOT NULL"),
        ("reason", "TEXT NOT NULL"),
        ("scope", "TEXT NOT NULL"),
        ("receiver_id", "TEXT"),
        ("seen_status", "TEXT NOT NULL"),
        ("result", "TEXT NOT NULL"),  # applied | refused
        ("refusal", "TEXT"),
        ("occurred_at", "TEXT NOT NULL"),
    ),
    ("event_id",),
)

# Version 6: the endpoint registry (ledger.endpoints, events/endpoints.py), one row per
# endpoint as its newest event says. Never a secret: how many it has, and the latest
# expiry of one being rotated out (whether a secret still signs is a question of now).
ENDPOINTS = Table(
    "endpoints",
    (
        ("endpoint_id", "TEXT NOT NULL"),
        ("channel", "TEXT NOT NULL"),
        ("address", "TEXT NOT NULL"),
        ("state", "TEXT NOT NULL"),  # active | paused | disabled
        ("paused_by", "TEXT"),
        ("paused_reason", "TEXT"),
        ("paused_at", "TEXT"),
        ("disabled_by", "TEXT"),
        ("disabled_reason", "TEXT"),
        ("disabled_at", "TEXT"),
        # Version 7: the circuit breaker (closed | open | half_open), since when, and the
        # half-open probe delivery (events/endpoints.py Breaker).
        ("circuit", "TEXT NOT NULL"),
        ("circuit_since", "TEXT"),
        ("circuit_probe", "TEXT"),
        ("lookup_url", "TEXT"),
        ("receiver_dedupes", "INTEGER NOT NULL"),
        ("rate_limit_per_s", "TEXT"),
        ("slo_s", "INTEGER"),
        ("secrets", "INTEGER NOT NULL"),
        ("rotation_ends_at", "TEXT"),
        ("version", "INTEGER NOT NULL"),
        ("registered_at", "TEXT NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
    ),
    ("endpoint_id",),
)

# Version 9: agents' send budgets (ledger.budgets, events/budgets.py). Each agent's book,
# folded by the book's own rule and kept as text between batches (events/budget_codec.py),
# and what it says per budget: its terms and its newest window's counts.
BUDGET_BOOKS = Table(
    "budget_books",
    (
        ("agent", "TEXT NOT NULL"),
        ("book", "TEXT NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
    ),
    ("agent",),
)

BUDGETS = Table(
    "budgets",
    (
        ("agent", "TEXT NOT NULL"),
        ("scope", "TEXT NOT NULL"),  # the channel, or '' for every channel
        ("channel", "TEXT"),  # the channel, or NULL for every channel
        ("budget_limit", "INTEGER NOT NULL"),
        ("window_s", "INTEGER NOT NULL"),
        ("anchor", "TEXT NOT NULL"),
        # The newest window anything was spent or released in (NULL: none yet), its
        # deliveries granted and its allowance from releases.
        ("window_start", "TEXT"),
        ("granted", "INTEGER NOT NULL"),
        ("allowance", "INTEGER NOT NULL"),
        # Keys spent beyond the budget and not released (every window kept).
        ("over", "INTEGER NOT NULL"),
        ("updated_at", "TEXT NOT NULL"),
    ),
    ("agent", "scope"),
)

SKIPPED_RECORDS = Table(
    "skipped_records",
    (
        ("topic", "TEXT NOT NULL"),
        ("kafka_partition", "INTEGER NOT NULL"),
        ("record_offset", "INTEGER NOT NULL"),
        ("reason", "TEXT NOT NULL"),
    ),
    ("topic", "kafka_partition", "record_offset"),
)

PROJECTION_OFFSETS = Table(
    "projection_offsets",
    (
        ("topic", "TEXT NOT NULL"),
        ("kafka_partition", "INTEGER NOT NULL"),
        ("next_offset", "INTEGER NOT NULL"),
    ),
    ("topic", "kafka_partition"),
)

PROJECTION_META = Table(
    "projection_meta",
    (("name", "TEXT NOT NULL"), ("value", "TEXT NOT NULL")),
    ("name",),
)

# Creation order; also the order of dumps and of ``ledger verify``'s comparison.
TABLES: tuple[Table, ...] = (
    AGENT_RUNS,
    DELIVERIES,
    DELIVERY_ATTEMPTS,
    DUPLICATE_KEYS,
    OPERATOR_ACTIONS,
    ENDPOINTS,
    BUDGET_BOOKS,
    BUDGETS,
    SKIPPED_RECORDS,
    PROJECTION_OFFSETS,
    PROJECTION_META,
)

INDEXES: tuple[str, ...] = (
    "CREATE INDEX deliveries_run ON deliveries (run_id)",
    "CREATE INDEX deliveries_status ON deliveries (status, slo_deadline)",
    "CREATE INDEX duplicate_keys_key ON duplicate_keys (idempotency_key)",
    # Version 2: indexes for the dashboard, so its page stays fast at 100k+ deliveries.
    "CREATE INDEX duplicate_keys_run ON duplicate_keys (run_id)",
    "CREATE INDEX delivery_attempts_run ON delivery_attempts (run_id)",
    "CREATE INDEX delivery_attempts_class ON delivery_attempts (channel, error_class, outcome)",
    "CREATE INDEX deliveries_created ON deliveries (created_at, status)",
    "CREATE INDEX deliveries_outcome ON deliveries (status, run_id, created_at, confirmed_at)",
    "CREATE INDEX agent_runs_status ON agent_runs (run_id, status)",
    # The backlog (projections/queries.py: pending_by_channel), covered so that its cost
    # follows the pending rows, never the settled ones. An index holds no data of its own
    # and ``ledger project`` creates a missing one (Store.ensure_indexes): no version bump.
    "CREATE INDEX deliveries_pending ON deliveries (status, channel, created_at)",
    "CREATE INDEX deliveries_waiting ON deliveries (waiting, channel, recipient)",
    "CREATE INDEX deliveries_agent_waiting ON deliveries (waiting, agent)",
    # Endpoint health (projections/health.py): pending per recipient and reason, covered.
    "CREATE INDEX deliveries_pending_endpoint ON deliveries (status, channel, recipient, waiting)",
    "CREATE INDEX operator_actions_run ON operator_actions (run_id, occurred_at)",
    "CREATE INDEX operator_actions_key ON operator_actions (idempotency_key, occurred_at)",
)


def _native(kind: str, native: Mapping[str, str]) -> str:
    base, _, rest = kind.partition(" ")
    return " ".join(part for part in (native.get(base, base), rest) if part)


def timestamp(moment: datetime) -> str:
    """A time as the fixed-width UTC text every table stores."""
    # isoformat is several times faster than strftime, and rebuilds format every event.
    if moment.tzinfo is UTC:
        # Events hold their times in UTC already (events/base.py): no conversion, no copy.
        return moment.isoformat(timespec="microseconds")[:-6] + "Z"
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
