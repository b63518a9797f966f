"""One contract every idempotency store keeps, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter

from receiver.records import Admission, KeyStatus
from receiver.store import IdempotencyStore
from tests.receiver.conftest import StoreFactory


async def test_a_new_key_runs_and_is_recorded_as_processing(store: IdempotencyStore) -> None:
    decision = await store.admit("k1", 1)
    assert decision.admission is Admission.RUN
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.fencing_token) == (KeyStatus.PROCESSING, 1)
    assert await store.get("never-sent") is None


async def test_a_done_key_answers_its_first_result(store: IdempotencyStore) -> None:
    await store.admit("k1", 1)
    await store.complete("k1", "order-7")
    again = await store.admit("k1", 1)
    assert again.admission is Admission.DUPLICATE
    assert again.record.result_id == "order-7"
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.result_id) == (KeyStatus.DONE, "order-7")


async def test_a_second_request_while_processing_does_not_run(store: IdempotencyStore) -> None:
    await store.admit("k1", 1)
    assert (await store.admit("k1", 1)).admission is Admission.IN_PROGRESS


async def test_a_failed_key_runs_again(store: IdempotencyStore) -> None:
    await store.admit("k1", 1)
    await store.fail("k1", "RuntimeError")
    failed = await store.get("k1")
    assert failed is not None
    assert (failed.status, failed.error) == (KeyStatus.FAILED, "RuntimeError")
    assert (await store.admit("k1", 2)).admission is Admission.RUN
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.fencing_token) == (KeyStatus.PROCESSING, 2)


async def test_an_older_fencing_token_is_stale_and_the_newest_is_kept(
    store: IdempotencyStore,
) -> None:
    await store.admit("k1", 3)
    await store.complete("k1", "order-1")
    assert (await store.admit("k1", 5)).admission is Admission.DUPLICATE  # newer: remembered
    stale = await store.admit("k1", 4)
    assert stale.admission is Admission.STALE
    assert stale.seen_token == 5
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.fencing_token, record.result_id) == (
        KeyStatus.DONE,
        5,
        "order-1",
    )
    # No header at all: nothing to fence with, answered as a duplicate.
    assert (await store.admit("k1", None)).admission is Admission.DUPLICATE


async def test_concurrent_admissions_of_one_key_across_stores_run_it_once(
    store_factory: StoreFactory,
) -> None:
    """1,000 simultaneous admissions of 10 keys through 4 stores over one database (as 4
    receiver processes): exactly one RUN per key."""
    stores = [store_factory() for _ in range(4)]
    for each in stores:
        await each.start()
    keys = [f"key-{n}" for n in range(10)]
    calls = [stores[i % 4].admit(keys[i // 100], 1) for i in range(1000)]
    decisions = await asyncio.gather(*calls)
    runs = Counter(d.record.key for d in decisions if d.admission is Admission.RUN)
    assert runs == Counter(dict.fromkeys(keys, 1))
    assert all(d.admission in (Admission.RUN, Admission.IN_PROGRESS) for d in decisions)
