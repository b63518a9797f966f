"""The questions operators ask, answered from the ledger tables (for CLI and dashboard).

Nothing here reads the clock: questions about time take ``now`` as a parameter.
Every answer is a list of plain dicts (JSON-ready), in a stable order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from events.redaction import redacted_data
from projections.fold import Row
from projections.schema import timestamp
from projections.store import Store


def overdue_pending(store: Store, now: datetime) -> list[Row]:
    """PENDING deliveries whose SLO deadline (requested_at + slo_seconds) is before ``now``."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
        "next_attempt_at, created_at, slo_deadline FROM deliveries "
        "WHERE status = 'PENDING' AND slo_deadline < ? ORDER BY slo_deadline, idempotency_key",
        (timestamp(now),),
    )


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


def overdue_sent(store: Store, now: datetime) -> list[Row]:
    """SENT deliveries past their SLO deadline: accepted, but not confirmed in time."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, provider_message_id, "
        "reconciliation, updated_at, slo_deadline FROM deliveries "
        "WHERE status = 'SENT' AND slo_deadline < ? ORDER BY slo_deadline, idempotency_key",
        (timestamp(now),),
    )


def unknown_awaiting_reconciliation(store: Store) -> list[Row]:
    """UNKNOWN deliveries: nobody knows whether they left; a provider lookup must decide."""
    return store.rows(
        "SELECT idempotency_key, run_id, channel, recipient, attempts, last_error_class, "
        "reconciliation, updated_at AS unknown_since FROM deliveries "
        "WHERE status = 'UNKNOWN' ORDER BY updated_at, idempotency_key"
    )


def confirmed_without_result(store: Store) -> list[Row]:
    """CONFIRMED deliveries whose run has no recorded success (no ``RunSucceeded``)."""
    return store.rows(
        "SELECT d.idempotency_key, d.run_id, d.channel, d.recipient, d.provider_message_id, "
        "d.confirmed_at, r.status AS run_status FROM deliveries d "
        "LEFT JOIN agent_runs r ON r.run_id = d.run_id "
        "WHERE d.status = 'CONFIRMED' AND (r.run_id IS NULL OR r.status <> 'SUCCEEDED') "
        "ORDER BY d.confirmed_at, d.idempotency_key"
    )


def duplicate_conflicts(store: Store) -> list[Row]:
    """The same idempotency key requested again with a different payload."""
    return store.rows(
        "SELECT k.idempotency_key, k.run_id, d.channel, d.recipient, k.payload_hash, "
        "k.original_payload_hash, k.occurred_at, k.event_id FROM duplicate_keys k "
        "LEFT JOIN deliveries d ON d.idempotency_key = k.idempotency_key "
        "WHERE k.outcome = 'conflict' ORDER BY k.occurred_at, k.event_id"
    )


def attempts_by_channel(store: Store) -> list[Row]:
    """Attempt counts per channel, error class (None: no error) and outcome."""
    return store.rows(
        "SELECT channel, error_class, outcome, COUNT(*) AS attempts FROM delivery_attempts "
        "GROUP BY channel, error_class, outcome "
        "ORDER BY channel, COALESCE(error_class, ''), outcome"
    )


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
    )
    shown: dict[str, Any] = redacted_data(report.to_json())
    # The backlog holds channel names, counts and times only: nothing to redact.
    return StatusReport(**{**shown, "backlog": report.backlog})
