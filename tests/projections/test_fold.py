"""Folding without a broker: batch boundaries and re-reads never change the tables, and
the state rules hold (authoritative confirmation is final, stale fencing tokens are history)."""

from __future__ import annotations

import itertools
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from events import (
    DeliveryClaimed,
    DeliveryReconciled,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    encode,
)
from events.execution import ExecutionEvent
from events.model import AnyDeliveryEvent, AnyExecutionEvent
from projections.backends import open_store
from projections.database import Dump
from projections.fold import Batch, Position, apply
from projections.records import LogRecord, decode_at
from tests.projections.scenarios import (
    P,
    at,
    fleet,
    happy,
    incident_log,
    requested,
)

LOG = [*incident_log(), *fleet(3)]


def records(events: list[AnyExecutionEvent | AnyDeliveryEvent]) -> list[LogRecord]:
    """Each entity's events in one partition, in order, as the topics would hold them."""
    offsets: dict[tuple[str, int], int] = {}
    out = []
    for event in events:
        topic = "runs" if isinstance(event, ExecutionEvent) else "deliveries"
        part = zlib.crc32(event.run_id.encode()) % 3
        offset = offsets.get((topic, part), 0)
        offsets[(topic, part)] = offset + 1
        out.append(decode_at(topic, part, offset, encode(event)))
    out.append(decode_at("deliveries", 0, offsets.get(("deliveries", 0), 0), b"[]"))
    return out


def fold_in_batches(recs: list[LogRecord], cuts: list[int]) -> Dump:
    store = open_store(":memory:")
    store.prepare("project")
    bounds = [0, *sorted(set(cuts)), len(recs)]
    for start, end in itertools.pairwise(bounds):
        store.apply_records(recs[start:end], frozenset())
    return store.dump()


RECORDS = records(LOG)
ONE_BATCH = fold_in_batches(RECORDS, [])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(RECORDS)), max_size=12))
def test_batch_boundaries_do_not_change_the_tables(cuts: list[int]) -> None:
    assert fold_in_batches(RECORDS, cuts) == ONE_BATCH


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=1, max_value=len(RECORDS)), st.integers(min_value=0, max_value=40))
def test_re_reading_already_applied_records_changes_nothing(upto: int, back: int) -> None:
    store = open_store(":memory:")
    store.prepare("project")
    store.apply_records(RECORDS[:upto], frozenset())
    # A restart re-reads from an older position: those records are dropped, not re-applied.
    batch = store.apply_records(RECORDS[max(0, upto - back) :], frozenset())
    assert batch.applied + len(batch.skipped) == len(RECORDS) - upto
    assert store.dump() == ONE_BATCH


def test_stale_fencing_token_is_history_and_confirmation_is_final() -> None:
    req = requested("run-f", 1, 0)
    common = {"idempotency_key": req.idempotency_key, "run_id": "run-f", "producer": P}
    events: list[AnyDeliveryEvent] = [
        req,
        DeliveryClaimed(**common, attempt=1, worker_id="old", fencing_token=1,
                        lease_expires_at=at(30), occurred_at=at(1)),
        # The lease expired (UNKNOWN), two lookups found nothing, a retry was scheduled,
        # and a new claim supersedes the old worker.
        DeliveryUnknown(**common, attempt=1, fencing_token=1, error_class="lease_expired",
                        reason="lease expired", occurred_at=at(30)),
        *(DeliveryReconciled(**common, attempt=1, fencing_token=1, outcome="not_found",
                             evidence="404", occurred_at=at(t)) for t in (31, 32)),
        DeliveryRetryScheduled(**common, attempt=1, next_attempt=2, retry_at=at(33),
                               error_class="lease_expired", safety="not found twice",
                               occurred_at=at(32)),
        DeliveryClaimed(**common, attempt=2, worker_id="new", fencing_token=2,
                        lease_expires_at=at(60), occurred_at=at(33)),
        # The old worker reports late: recorded on its attempt, the delivery does not move.
        DeliveryUnknown(**common, attempt=1, fencing_token=1, error_class="timeout_after_write",
                        reason="late", occurred_at=at(34)),
        *happy(req, 40, attempt=2, token=2)[1:],
        DeliverySent(**common, attempt=1, fencing_token=1, worker_id="old", occurred_at=at(50)),
    ]  # fmt: skip
    batch = Batch()
    for n, event in enumerate(events):
        apply(batch, Position("deliveries", 0, n), event)
        if n == 7:
            stale = batch.deliveries[req.idempotency_key]
            assert (stale["status"], stale["last_error_class"]) == ("PENDING", "lease_expired")
    row = batch.deliveries[req.idempotency_key]
    assert (row["status"], row["attempts"], row["fencing_token"]) == ("CONFIRMED", 2, 2)
    assert row["provider_message_id"] == f"msg-{req.idempotency_key[:6]}-2"
    old = batch.attempts[(req.idempotency_key, 1)]
    assert (old["outcome"], old["worker_id"], old["error_class"]) == (
        "SENT",
        "old",
        "timeout_after_write",
    )
