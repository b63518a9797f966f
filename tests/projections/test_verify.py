"""verify's second check without a broker: the worker's fold of the same records against
the projected delivery rows, one difference per delivery."""

from __future__ import annotations

from projections.backends import open_store
from projections.schema import DELIVERIES
from projections.worker_refold import WorkerFold, compare_rules
from tests.projections.scenarios import fleet, incident_log, requested
from tests.projections.test_fold import records


def test_projected_rows_agree_with_the_worker_fold_and_a_changed_row_is_reported() -> None:
    recs = records([*incident_log(), *fleet(3)])
    store = open_store(":memory:")
    store.prepare("project")
    store.apply_records(recs, frozenset())
    fold = WorkerFold()
    fold(recs)
    assert compare_rules(store.dump()[DELIVERIES.name], fold) == []

    a2 = requested("run-a", 2, 1)
    store.begin()
    store.rows("UPDATE deliveries SET status = 'SENT', fencing_token = 7 WHERE idempotency_key = ?",
               (a2.idempotency_key,))  # fmt: skip
    store.rows("DELETE FROM deliveries WHERE run_id = 'run-b'")
    store.commit()
    differences = compare_rules(store.dump()[DELIVERIES.name], fold)
    b1 = requested("run-b", 1, 100, slo=30)
    assert sorted(d.line() for d in differences) == sorted([
        f"delivery {a2.idempotency_key} (run run-a): worker's rules differ: "
        "status: projected='SENT' worker='CONFIRMED'; fencing_token: projected=7 worker=2",
        f"delivery {b1.idempotency_key} (run run-b): worker's rules differ: "
        "row: projected=None worker='PENDING'",
    ])  # fmt: skip
