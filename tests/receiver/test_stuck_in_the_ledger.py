"""A receiver-kit key stuck after its handler died, as the ledger sees it: a real worker on
the real broker delivers to the kit (a process of its own, handler not declared
idempotent), the kit is SIGKILLed mid-handler and restarted; the worker's lookups find the
key ``stuck``, the delivery stays UNKNOWN with ``receiver_stuck`` (in the fold and in the
projection ``ledger status`` reads) and the worker stops looking it up."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients import DeliverySpec
from config.settings import WebhookEndpoint, changed
from events.delivery_state import Status
from events.outcomes import ErrorClass, LookupOutcome
from projections import open_store
from projections.queries import UNKNOWN
from tests.fixtures.projection import LiveProjection
from tests.fixtures.secrets import TEST_WEBHOOK_SECRET
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for
from tests.receiver.dying_receiver import DyingReceiver
from tests.streams.matrix import publish

LEASE_S = 1.5


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[DyingReceiver]:
    made = DyingReceiver(tmp_path, TEST_WEBHOOK_SECRET, lease_s=LEASE_S, idempotent=False)
    yield made
    made.stop()


def _lookups(receiver: DyingReceiver, key: str) -> int:
    """The lookups of ``key`` the receiver answered (uvicorn's access log)."""
    return sum(f"/hooks/lookup/{key} " in line for line in receiver.log.read_text().splitlines())


def _unknown_rows(dsn: str) -> dict[str, tuple[str, str | None]]:
    store = open_store(dsn)
    try:
        store.prepare("read")
        rows = UNKNOWN.rows(store)
    finally:
        store.close()
    return {
        row["idempotency_key"]: (row["last_error_class"], row["reconciliation"]) for row in rows
    }


async def test_a_stuck_receiver_key_stays_unknown_as_receiver_stuck_and_is_not_looked_up_again(
    worker_factory: WorkerFactory,
    receiver: DyingReceiver,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    base = receiver.base
    worker_factory.settings = changed(
        worker_factory.settings,
        {
            "channels.webhook_endpoints": {
                f"{base}/hooks/": WebhookEndpoint(lookup_url=f"{base}/hooks/lookup")
            },
            # Frequent lookups, and far more of them than this test waits for: if the
            # worker went on looking it up, the receiver's log would show it.
            "worker.lookup_backoff_s": 0.5,
            "worker.lookup_backoff_max_s": 1.0,
            "worker.max_lookups": 100,
        },
    )
    live_projection.settings = worker_factory.settings
    receiver.start()
    worker = worker_factory.start("w1")
    live_projection.start()
    keys = await publish(
        worker_factory.settings,
        "run-stuck",
        [
            DeliverySpec(
                channel="webhook", recipient=f"{base}/hooks/tickets", payload={"sleep_s": 60}
            )
        ],
    )
    key = keys[0]
    await asyncio.to_thread(receiver.wait_for, f"start {key}", 60)
    receiver.kill()  # mid-handler: the key stays "processing" in the kit's store
    receiver.start()

    async def stuck() -> bool:
        assert worker.alive(), worker.output()[-2000:]
        state = (await ledger_view()).get(key)
        return state is not None and state.last_error_class == ErrorClass.RECEIVER_STUCK

    await wait_for(stuck, 45, "the ledger to record the key as receiver_stuck")
    state = (await ledger_view())[key]
    assert (state.status, state.reconciled) == (Status.UNKNOWN, LookupOutcome.STUCK)
    seen = _lookups(receiver, key)
    assert seen >= 1
    # Settled for an operator: no more lookups (backoff 0.5..1 s would have made several).
    await asyncio.sleep(5)
    assert _lookups(receiver, key) == seen
    assert (await ledger_view())[key].lookups == state.lookups
    assert receiver.lines() == [f"start {key}"]  # the handler never ran again

    async def projected() -> bool:
        try:
            rows = await asyncio.to_thread(_unknown_rows, live_projection.dsn)
        except Exception:  # the projector may not have created its tables yet
            return False
        return rows.get(key, (None, None))[0] == ErrorClass.RECEIVER_STUCK

    await wait_for(projected, 30, "the projection's UNKNOWN row to say receiver_stuck")
