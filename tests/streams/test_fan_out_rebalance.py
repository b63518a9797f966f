"""Record-mode runs published while a second worker joins: each delivery arrives once.

At the end of a rebalance faust dropped records it had fetched (the agents' queues emptied
once more after the seek to the committed offsets; batches broken off while the flow was
stopped), and a partition without a committed offset was not sought back to read them
again: the offsets of later records were committed past them (streams/faust_internals.py,
KeptFlowControl and HookedConsumer.seek_to_committed). A run record dropped so was never
fanned out. Here every partition's first records are written while both workers take (or
take back) their partitions; each delivery must reach a receiver that does NOT dedupe
exactly once.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from clients import DeliverySpec, Publisher
from config.settings import Settings, changed
from ledger.simulator import SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.broker import fresh_topics
from tests.fixtures.receiver import signing_secret
from tests.fixtures.worker import WorkerFactory, WorkerProcess, fast_workers, wait_for

pytestmark = pytest.mark.xdist_group("fan_out_rebalance")

# Runs published at a time, every PACE_S, from the moment the first worker's rebalance began.
BATCH = 8
PACE_S = 0.05
RUNS = 160


@dataclass
class Pair:
    settings: Settings
    receiver: BackgroundSimulator
    workers: WorkerFactory


@pytest.fixture(scope="module")
async def pair(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pair]:
    tmp = tmp_path_factory.mktemp("fan-out-rebalance")
    receiver = BackgroundSimulator(
        SimulatorConfig(dedupe=False, webhook_secret=signing_secret())
    ).start()
    settings = receiver.settings(fast_workers(await fresh_topics(broker, tmp / "data")))
    workers = WorkerFactory(changed(settings, {"publisher.mode": "record"}), tmp)
    try:
        yield Pair(workers.settings, receiver, workers)
    finally:
        workers.stop_all()
        receiver.stop()


def alive(*workers: WorkerProcess) -> None:
    for worker in workers:
        assert worker.alive(), worker.output()[-3000:]


def owns(worker: WorkerProcess) -> bool:
    return re.search(r"owns partitions \[\d", worker.output()) is not None


async def test_runs_published_while_a_worker_joins_are_each_delivered_once(pair: Pair) -> None:
    w1 = pair.workers.start("w1")

    async def w1_owns() -> bool:
        alive(w1)
        return owns(w1)

    await wait_for(w1_owns, 60, "w1 owning partitions", interval=0.1)
    w2 = pair.workers.start("w2")

    async def rebalancing() -> bool:
        alive(w1, w2)
        return "because it is rebalancing" in w1.output()

    # From the moment w1 hears of the rebalance: the first records of every partition
    # arrive while both workers take (or take back) their partitions.
    await wait_for(rebalancing, 60, "w1 rebalancing as w2 joins", interval=0.02)
    keys: list[str] = []
    async with Publisher(pair.settings, producer_name="agent") as publisher:
        for n in range(0, RUNS, BATCH):
            runs = [f"run{m}" for m in range(n, n + BATCH)]
            specs = [
                [DeliverySpec(channel="webhook", recipient=pair.receiver.webhook_url(r))]
                for r in runs
            ]
            done = await asyncio.gather(
                *(publisher.run_succeeded(r, "h", s) for r, s in zip(runs, specs, strict=True))
            )
            keys += [request.idempotency_key for requests in done for request in requests]
            await asyncio.sleep(PACE_S)

    async def arrived() -> bool:
        alive(w1, w2)
        return all(pair.receiver.accepted(key) >= 1 for key in keys)

    try:
        await wait_for(arrived, 30, f"all {len(keys)} deliveries")
    except AssertionError as exc:
        missing = [key[:12] for key in keys if pair.receiver.accepted(key) == 0]
        raise AssertionError(f"{exc}: {len(missing)} never arrived: {missing[:10]}") from None
    assert owns(w2), "w2 never took partitions"
    twice = [key[:12] for key in keys if pair.receiver.accepted(key) > 1]
    assert twice == [], f"arrived more than once: {twice}"
