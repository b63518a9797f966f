"""``ledger worker`` end to end: real broker, real worker processes, the real simulator."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clients import DeliverySpec, Publisher
from config.settings import Settings
from events.delivery_state import Status
from events.outcomes import ErrorClass
from events.ports import free_port
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for


async def publish(settings: Settings, run_id: str, specs: list[DeliverySpec]) -> list[str]:
    async with Publisher(settings, producer_name="test-agent") as publisher:
        requests = await publisher.run_succeeded(run_id, "sha256:r", specs)
    return [r.idempotency_key for r in requests]


async def settled(view: LedgerView, keys: list[str], *statuses: Status) -> bool:
    states = await view()
    return all(k in states and states[k].status in statuses for k in keys)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


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
    port = free_port()
    worker = worker_factory.start("w1", changes={"worker.metrics_port": port})

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return await settled(ledger_view, keys, Status.CONFIRMED)

    await wait_for(done, 60, "all three deliveries CONFIRMED")
    for key in keys:
        assert receiver.accepted(key) == 1
    states = await ledger_view()
    accepted = receiver.event(keys[2])
    assert accepted is not None
    assert states[keys[2]].provider_message_id == accepted.receiver_id
    assert worker.alive(), worker.output()

    # The worker's own /metrics agree with what the receiver saw.
    samples = scrape(port)
    sends = {
        labels: v for (name, labels), v in samples.items() if name == "ledger_worker_sends_total"
    }
    assert sum(sends.values()) == 3
    assert sends[(("channel", "webhook"), ("outcome", "confirmed"))] == 2
    assert sends[(("channel", "provider"), ("outcome", "sent"))] == 1  # queued: SENT, then lookup
    assert samples[("ledger_worker_send_seconds_count", (("channel", "provider"),))] == 1
    assert samples[("ledger_worker_owned_partitions", ())] == settings.kafka.partitions
    assert samples[("ledger_worker_dead_lettered_total", ())] == 0


async def test_a_recipient_on_an_internal_address_fails_blocked_and_is_never_contacted(
    worker_factory: WorkerFactory, receiver: BackgroundSimulator, ledger_view: LedgerView
) -> None:
    """The receiver listens on 127.0.0.1, which this worker does not allow: an agent's
    recipient pointing there (a model's output, say) must not make the worker call it."""
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    keys = await publish(
        settings,
        "run-internal",
        [
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url("admin"), payload={}),
            DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={}),
        ],
    )
    worker = worker_factory.start("w1", changes={"channels.allowed_networks": []})

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return await settled(ledger_view, keys, Status.FAILED)

    await wait_for(done, 60, "both deliveries FAILED")
    states = await ledger_view()
    for key in keys:
        assert states[key].last_error_class is ErrorClass.BLOCKED_ADDRESS
        assert "127.0.0.1, a loopback address" in (states[key].last_reason or "")
        assert states[key].attempt == 1  # no retry: the address stays what it is
    assert receiver.requests() == []


@pytest.mark.parametrize("pool", ["aiohttp", "httpcore"])
async def test_a_worker_on_uvloop_delivers_and_says_so(
    pool: str,
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
) -> None:
    settings = receiver.settings(worker_factory.settings)
    worker_factory.settings = settings
    keys = await publish(
        settings,
        f"run-uvloop-{pool}",
        [
            DeliverySpec(channel="webhook", recipient=receiver.webhook_url("ops"), payload={}),
            DeliverySpec(channel="provider", recipient=receiver.provider_url, payload={}),
        ],
    )
    worker = worker_factory.start(
        "w1", changes={"event_loop": "uvloop", "channels.http_pool": pool}
    )

    async def done() -> bool:
        assert worker.alive(), worker.output()[-3000:]
        return await settled(ledger_view, keys, Status.CONFIRMED)

    await wait_for(done, 60, "both deliveries CONFIRMED on uvloop")
    for key in keys:
        assert receiver.accepted(key) == 1
    assert "uvloop loop" in worker.output()
