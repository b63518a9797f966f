"""One contract every idempotency store keeps, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections import Counter

from receiver.records import Admission, KeyStatus
from receiver.store import IdempotencyStore
from tests.receiver.conftest import StoreFactory
from tests.receiver.support import lease


async def test_a_new_key_runs_and_is_recorded_as_processing(store: IdempotencyStore) -> None:
    run = lease()
    decision = await store.admit("k1", 1, run)
    assert decision.admission is Admission.RUN
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.fencing_token) == (KeyStatus.PROCESSING, 1)
    assert (record.lease_holder, record.lease_expires_at) == (run.holder, run.expires_at)
    assert await store.get("never-sent") is None


async def test_a_done_key_answers_its_first_result(store: IdempotencyStore) -> None:
    run = lease()
    await store.admit("k1", 1, run)
    assert await store.complete("k1", "order-7", run.holder)
    again = await store.admit("k1", 1, lease())
    assert again.admission is Admission.DUPLICATE
    assert again.record.result_id == "order-7"
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.result_id) == (KeyStatus.DONE, "order-7")


async def test_a_second_request_while_processing_does_not_run(store: IdempotencyStore) -> None:
    await store.admit("k1", 1, lease())
    assert (await store.admit("k1", 1, lease())).admission is Admission.IN_PROGRESS


async def test_a_failed_key_runs_again(store: IdempotencyStore) -> None:
    run = lease()
    await store.admit("k1", 1, run)
    assert await store.fail("k1", "RuntimeError", run.holder)
    failed = await store.get("k1")
    assert failed is not None
    assert (failed.status, failed.error) == (KeyStatus.FAILED, "RuntimeError")
    assert (await store.admit("k1", 2, lease())).admission is Admission.RUN
    record = await store.get("k1")
    assert record is not None
    assert (record.status, record.fencing_token) == (KeyStatus.PROCESSING, 2)


async def test_an_older_fencing_token_is_stale_and_the_newest_is_kept(
    store: IdempotencyStore,
) -> None:
    run = lease()
    await store.admit("k1", 3, run)
    await store.complete("k1", "order-1", run.holder)
    assert (await store.admit("k1", 5, lease())).admission is Admission.DUPLICATE  # remembered
    stale = await store.admit("k1", 4, lease())
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
    assert (await store.admit("k1", None, lease())).admission is Admission.DUPLICATE


async def test_concurrent_admissions_of_one_key_across_stores_run_it_once(
    store_factory: StoreFactory,
) -> None:
    """1,000 simultaneous admissions of 10 keys through 4 stores over one database (as 4
    receiver processes): exactly one RUN per key."""
    stores = [store_factory() for _ in range(4)]
    for each in stores:
        await each.start()
    keys = [f"key-{n}" for n in range(10)]
    calls = [stores[i % 4].admit(keys[i // 100], 1, lease()) for i in range(1000)]
    decisions = await asyncio.gather(*calls)
    runs = Counter(d.record.key for d in decisions if d.admission is Admission.RUN)
    assert runs == Counter(dict.fromkeys(keys, 1))
    assert all(d.admission in (Admission.RUN, Admission.IN_PROGRESS) for d in decisions)


async def test_a_live_lease_is_renewed_only_by_its_holder(store: IdempotencyStore) -> None:
    run = lease(now=1000.0, lease_s=30.0)
    await store.admit("k1", 1, run)
    assert await store.renew("k1", run.holder, 1100.0)
    assert not await store.renew("k1", "someone-else", 1200.0)
    record = await store.get("k1")
    assert record is not None
    assert record.lease_expires_at == 1100.0
    # Within the renewed lease a second request waits; it is not a dead run.
    assert (await store.admit("k1", 1, lease(now=1099.0))).admission is Admission.IN_PROGRESS
    assert not await store.complete("k1", "order-x", "someone-else")
    assert await store.complete("k1", "order-1", run.holder)
    assert not await store.renew("k1", run.holder, 1300.0)  # done: nothing to hold


async def test_a_dead_runs_key_is_stuck_unless_the_handler_is_idempotent(
    store: IdempotencyStore,
) -> None:
    dead = lease(now=1000.0, lease_s=10.0)
    await store.admit("stuck", 1, dead)
    old = lease(now=1000.0, lease_s=10.0)
    await store.admit("again", 1, old)
    after = 1010.0  # both leases ran out, never renewed
    stuck = await store.admit("stuck", 2, lease(now=after))
    assert stuck.admission is Admission.STUCK
    assert (await store.admit("stuck", 3, lease(now=after + 60))).admission is Admission.STUCK
    record = await store.get("stuck")
    assert record is not None
    assert (record.status, record.fencing_token, record.lease_holder) == (
        KeyStatus.PROCESSING,
        3,
        dead.holder,
    )
    # The dead run's own holder may still settle it, had it only been slow.
    assert await store.complete("stuck", "order-late", dead.holder)

    rerun = lease(now=after, idempotent_handler=True)
    reclaimed = await store.admit("again", 2, rerun)
    assert (reclaimed.admission, reclaimed.reclaimed) == (Admission.RUN, True)
    # The re-run holds the key now: a second redelivery waits, the old run is fenced out.
    second = await store.admit("again", 2, lease(now=after + 1, idempotent_handler=True))
    assert second.admission is Admission.IN_PROGRESS
    assert (await store.admit("again", 1, lease(now=after + 1))).admission is Admission.STALE
    assert not await store.complete("again", "order-old", old.holder)
    assert not await store.renew("again", old.holder, after + 100)
    assert await store.complete("again", "order-2", rerun.holder)
    record = await store.get("again")
    assert record is not None
    assert (record.status, record.result_id, record.lease_holder) == (
        KeyStatus.DONE,
        "order-2",
        rerun.holder,
    )
