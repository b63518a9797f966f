"""The live projector rides out its PostgreSQL restarting under it (issue 24, item 2).

Real broker, a real worker, a receiver that does not dedupe, ``ledger project`` into a
PostgreSQL cluster of this test's own, restarted twice while deliveries flow: the
projector keeps running, says so in one line per outage, and its projection equals a
rebuild afterwards (``ledger verify``).
"""

from __future__ import annotations

import asyncio
import time

from clients import DeliverySpec
from events.delivery_state import Status
from tests.fixtures.own_postgres import OwnPostgres
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import posts, publish, until, use

RUNS = 40


async def test_the_live_projector_rides_out_two_postgres_restarts(
    worker_factory: WorkerFactory,
    receiver_factory: ReceiverFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
    own_postgres: OwnPostgres,
) -> None:
    receiver = receiver_factory(dedupe=False)
    live_projection.dsn = own_postgres.dsn
    settings = use(worker_factory, receiver, live_projection)
    worker = worker_factory.start("w1")
    keys: list[str] = []

    async def flow() -> None:
        for n in range(RUNS):
            spec = DeliverySpec(
                channel="webhook", recipient=receiver.webhook_url(f"r{n}"), payload={"n": n}
            )
            keys.extend(await publish(settings, f"run-{n}", [spec]))
            await asyncio.sleep(0.4)

    flowing = asyncio.create_task(flow())
    # Let the projector create its tables and fold the first batches, then restart twice.
    await _projected_some(live_projection)
    outages = []
    for _ in range(2):
        outages.append(await asyncio.to_thread(own_postgres.restart, 2.0))
        assert live_projection.process is not None
        assert live_projection.process.poll() is None, live_projection.log.read_text()
        await asyncio.sleep(3.0)
    await flowing
    assert len(keys) == RUNS
    states = await until(ledger_view, keys, {Status.CONFIRMED}, [worker], "all CONFIRMED", receiver)
    for key in keys:
        assert receiver.accepted(key) == 1, key
        assert posts(receiver, key) == 1, key
    # Still running, the projection shows the ledger's states, and rebuilt == live.
    await live_projection.matches(states)
    said = live_projection.log.read_text()
    assert "this is a bug" not in said, said
    assert "cannot connect" not in said, said
    unreachable = [line for line in said.splitlines() if "unreachable (" in line]
    back = [line for line in said.splitlines() if " back after " in line]
    assert len(unreachable) == 2, said  # one line per outage, not one per attempt
    assert len(back) == 2, said
    print(f"outages {[round(s, 1) for s in outages]} s; projector said: {back}")


async def _projected_some(projection: LiveProjection, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert projection.process is not None
        assert projection.process.poll() is None, projection.log.read_text()
        try:
            if await asyncio.to_thread(projection.statuses):
                return
        except Exception:  # its tables may not exist yet
            pass
        await asyncio.sleep(0.5)
    raise AssertionError("the live projection showed no delivery in time")
