"""The questions operators ask, answered from the ledger tables (for CLI and dashboard).

Nothing here reads the clock: questions about time take ``now`` as a parameter.
Every answer is a list of plain dicts (JSON-ready), in a stable order.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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
        """True when any question has a worrying answer."""
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
        overdue_pending=overdue_pending(store, now),
        overdue_sent=overdue_sent(store, now),
        unknown=unknown_awaiting_reconciliation(store),
        confirmed_without_result=confirmed_without_result(store),
        duplicate_conflicts=duplicate_conflicts(store),
        attempts_by_channel=attempts_by_channel(store),
    )
    shown: dict[str, Any] = redacted_data(report.to_json())
    return StatusReport(**shown)
