"""``ledger worker`` end to end: real broker, real worker processes, the real simulator."""

from __future__ import annotations

from events import DeliverySpec, Publisher
from events.settings import Settings
from ledger.simulator.background import BackgroundSimulator
from streams.state import Status
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for


async def publish(settings: Settings, run_id: str, specs: list[DeliverySpec]) -> list[str]:
    async with Publisher(settings, producer_name="test-agent") as publisher:
        requests = await publisher.run_succeeded(run_id, "sha256:r", specs)
    return [r.idempotency_key for r in requests]


async def settled(view: LedgerView, keys: list[str], *statuses: Status) -> bool:
    states = await view()
    return all(k in states and states[k].status in statuses for k in keys)


async def test_happy_path_every_delivery_confirmed_once(
    worker_factory: WorkerFactory, receiver: BackgroundSimulator, ledger_view: LedgerView
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    keys = await publish(
        settings,
        "run-happy",
        [
            DeliverySpec(
                channel="webhook", recipient=receiver.webhook_url("ops"), payload={"n": 1}
            ),
            DeliverySpec(
                channel="webhook", recipient=receiver.webhook_url("audit"), payload={"n": 2}
            ),
            DeliverySpec(
                channel="provider", recipient=receiver.provider_url, payload={"to": "a@b.c"}
            ),
        ],
    )
    worker = worker_factory.start("w1")

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return await settled(ledger_view, keys, Status.CONFIRMED)

    await wait_for(done, 60, "all three deliveries CONFIRMED")
    for key in keys:
        assert receiver.accepted(key) == 1
    states = await ledger_view()
    provider_key = keys[2]
    assert states[provider_key].provider_message_id
    assert worker.alive(), worker.output()
