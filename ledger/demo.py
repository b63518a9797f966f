"""The main job, first version: broker, topics, one sample run, its events replayed."""

from __future__ import annotations

import asyncio
import uuid

from rich.console import Console

from events.publisher import DeliverySpec, Publisher
from events.settings import Settings
from ledger.broker import LocalBroker
from ledger.render import event_line
from ledger.replay import ReplayFilter, replay
from ledger.topics import create_topics


def run_demo(settings: Settings, out: Console) -> None:
    """Start (or reuse) the broker, create topics, publish a run with 3 deliveries, replay it."""
    broker = LocalBroker(settings)
    with out.status("starting the local Kafka broker..."):
        report = broker.start()
    state = "reused" if report.already_running else f"started in {report.seconds:.1f}s"
    out.print(f"[bold]broker[/] {settings.bootstrap_servers} {state}")
    for topic in asyncio.run(create_topics(settings)):
        out.print(f"[bold]topic[/] {topic.name} ({topic.partitions} partitions)")
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    deliveries = [
        DeliverySpec(
            channel="webhook",
            recipient="http://127.0.0.1:8787/hooks/ops",
            payload={"text": f"run {run_id} finished"},
        ),
        DeliverySpec(
            channel="webhook",
            recipient="http://127.0.0.1:8787/hooks/audit",
            payload={"run": run_id, "status": "succeeded"},
        ),
        DeliverySpec(
            channel="provider",
            recipient="http://127.0.0.1:8787/provider",
            payload={"to": "oncall@example.test", "body": "done"},
        ),
    ]

    async def publish_and_replay() -> None:
        async with Publisher(settings, producer_name="demo-agent") as publisher:
            await publisher.run_started(run_id, agent="demo-agent")
            await publisher.run_succeeded(run_id, f"sha256:{uuid.uuid4().hex}", deliveries)
        out.print(
            f"[bold]published[/] run {run_id}: RunSucceeded + 3 DeliveryRequested, one transaction"
        )
        out.print(f"[bold]replay[/] --run-id {run_id}")
        topics = [settings.topic_runs, settings.topic_deliveries]
        async for record in replay(settings, topics, ReplayFilter(run_id=run_id)):
            out.print("  " + event_line(record), highlight=False)

    asyncio.run(publish_and_replay())
    out.print("the broker keeps running; stop it with 'ledger broker stop'")
