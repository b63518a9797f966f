"""The operator counters (issue 26, item 5): deliveries settled by an operator, by
outcome; redrives, by result; the age of the oldest unresolved UNKNOWN. One answer in
projections/queries.py, asked by ``ledger status``, the dashboard and ``/metrics``; here
from a real projection (SQLite, PostgreSQL) fed the real events."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from config.settings import Settings
from events import encode
from events.delivery import DeliveryReconciled
from events.execution import ExecutionEvent
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from projections.backends import open_store
from projections.dashboard.overview import overview
from projections.metrics import LogNumbers, exposition, projection_numbers
from projections.queries import operator_counts, status_report
from projections.records import decode_at
from projections.store import Store
from tests.fixtures.postgres import DsnFactory
from tests.projections.operator_scenario import U, operator_log, resolved
from tests.projections.scenarios import P, at, incident_log

Events = Sequence[AnyExecutionEvent | AnyDeliveryEvent]


def fold(store: Store, events: Events, start: int = 0) -> None:
    """Apply ``events`` as the log holds them (runs and deliveries, one partition each)."""
    records = [
        decode_at(
            "runs" if isinstance(e, ExecutionEvent) else "deliveries", 0, start + n, encode(e)
        )
        for n, e in enumerate(events)
    ]
    store.apply_records(records, frozenset())


@pytest.fixture
def store(dsn_factory: DsnFactory) -> Iterator[Store]:
    """A fresh projection, on each backend."""
    projection = open_store(dsn_factory())
    projection.prepare("project")
    try:
        yield projection
    finally:
        projection.close()


def test_counts_of_a_log_without_operator_actions(store: Store) -> None:
    fold(store, incident_log())
    counts = operator_counts(store, at(3605))
    assert counts.settled == {"delivered": 0, "not_delivered": 0, "abandoned": 0}
    assert counts.redrives == {"applied": 0, "refused": 0}
    # run-a's third delivery: UNKNOWN since its reset at T0+5s.
    assert (counts.unknown_now, counts.oldest_unknown_since) == (1, "2026-01-05T09:00:05.000000Z")
    assert counts.oldest_unknown_age_seconds == 3600.0


def test_counts_of_an_empty_projection(store: Store) -> None:
    counts = operator_counts(store, at(0))
    assert (counts.unknown_now, counts.oldest_unknown_since) == (0, None)
    assert counts.oldest_unknown_age_seconds == 0.0
    assert sum(counts.settled.values()) + sum(counts.redrives.values()) == 0


def test_settled_by_outcome_redrives_by_result_and_the_oldest_unknown(store: Store) -> None:
    log = operator_log()
    fold(store, log)
    counts = operator_counts(store, at(3605))
    # Applied resolves only: the resolve of the CONFIRMED delivery was refused.
    assert counts.settled == {"delivered": 1, "not_delivered": 1, "abandoned": 1}
    assert counts.redrives == {"applied": 2, "refused": 2}
    # U[3] (UNKNOWN since T0+5s) and U5 (since T0+304s, redriven for a fresh lookup).
    assert counts.unknown_now == 2
    assert counts.oldest_unknown_since == "2026-01-05T09:00:05.000000Z"
    assert counts.oldest_unknown_age_seconds == 3600.0
    # The same numbers as the operator_actions rows, and the rows the deliveries carry.
    rows = store.rows("SELECT action, outcome, result FROM operator_actions ORDER BY occurred_at")
    assert [(r["action"], r["outcome"], r["result"]) for r in rows] == [
        ("resolve", "delivered", "applied"),
        ("resolve", "not_delivered", "applied"),
        ("resolve", "abandoned", "applied"),
        ("redrive", None, "applied"),
        ("redrive", None, "refused"),
        ("redrive", None, "refused"),
        ("resolve", "delivered", "refused"),
        ("redrive", None, "applied"),
    ]
    settled = store.rows(
        "SELECT idempotency_key, status, settled_by FROM deliveries WHERE settled_by IS NOT NULL"
    )
    assert {(r["idempotency_key"], r["status"]) for r in settled} == {
        (U[0].idempotency_key, "CONFIRMED"),
        (U[2].idempotency_key, "FAILED"),
    }


def test_a_lookup_does_not_make_an_old_unknown_look_young(store: Store) -> None:
    log = operator_log()
    fold(store, log)
    lookup = DeliveryReconciled(
        idempotency_key=U[3].idempotency_key, run_id="run-o", producer=P, attempt=1,
        fencing_token=1, outcome="lookup_error", evidence="503", occurred_at=at(3000),
    )  # fmt: skip
    fold(store, [lookup], start=len(log))
    updated = store.rows(
        "SELECT updated_at FROM deliveries WHERE idempotency_key = ?", (U[3].idempotency_key,)
    )
    assert updated == [{"updated_at": "2026-01-05T09:50:00.000000Z"}]
    assert operator_counts(store, at(3605)).oldest_unknown_age_seconds == 3600.0


def test_an_unknown_settled_leaves_the_next_oldest(store: Store) -> None:
    log = operator_log()
    fold(store, log)
    fold(store, [resolved(U[3], 500, "abandoned")], start=len(log))
    counts = operator_counts(store, at(3604))
    assert counts.settled["abandoned"] == 2
    assert (counts.unknown_now, counts.oldest_unknown_since) == (1, "2026-01-05T09:05:04.000000Z")
    assert counts.oldest_unknown_age_seconds == 3300.0  # U5's, UNKNOWN since T0+304s


def test_status_the_dashboard_and_metrics_give_the_one_answer(store: Store) -> None:
    fold(store, operator_log())
    now = at(3605)
    expected = operator_counts(store, now)
    assert status_report(store, now).operators == expected
    assert status_report(store, now).to_json()["operators"]["settled"]["delivered"] == 1
    page = overview(store, now)
    assert page.operators == expected
    assert page.to_json()["operators"]["redrives"] == {"applied": 2, "refused": 2}
    text = exposition(projection_numbers(store, now, {}), LogNumbers(), Settings()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for outcome, n in expected.settled.items():
        assert samples[("ledger_operator_settled_total", (("outcome", outcome),))] == n
    for result, n in expected.redrives.items():
        assert samples[("ledger_redrives_total", (("result", result),))] == n
    assert samples[("ledger_oldest_unknown_age_seconds", ())] == 3600.0
    assert "# TYPE ledger_operator_settled_total counter" in text
    assert "# TYPE ledger_redrives_total counter" in text
    assert "# TYPE ledger_oldest_unknown_age_seconds gauge" in text
