"""What the demo publishes: runs, each with a delivery over every channel (a browser form
every ``BROWSER_EVERY`` runs), at the rate asked; after the summary, a run every 2 s."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from rich.console import Console

from clients.publisher import DeliverySpec, Publisher
from ledger.demo.assembly import DemoStack
from ledger.demo.options import (
    BROWSER_TARGET,
    DEMO_SLACK_CHANNEL,
    DEMO_SLACK_WORKSPACE,
    DemoOptions,
)
from ledger.demo.summary import status_line
from ledger.observe import LedgerObserver

# two webhooks, a provider message, a Slack message, an email by API, an email by SMTP
CHANNELS_PER_RUN = 6
# A form submitted by Chromium every 6th run (from the first): ~7 of the default 40 runs.
BROWSER_EVERY = 6


def deliveries_for(runs: int, start: int = 0) -> int:
    """How many deliveries runs ``start`` .. ``start + runs - 1`` publish."""
    browser = sum(1 for n in range(start, start + runs) if n % BROWSER_EVERY == 0)
    return runs * CHANNELS_PER_RUN + browser


def _specs(run_id: str, n: int, urls: dict[str, Any]) -> list[DeliverySpec]:
    """The deliveries of run number ``n``."""
    done = f"run {run_id} finished"
    email = {"subject": done, "text": "report ready"}
    slack = f"{DEMO_SLACK_WORKSPACE}/{DEMO_SLACK_CHANNEL}"
    specs = [
        DeliverySpec(
            channel="webhook", recipient=f"{urls['base']}/hooks/ops", payload={"text": done}
        ),
        DeliverySpec(
            channel="webhook",
            recipient=f"{urls['base']}/hooks/audit",
            payload={"run": run_id, "status": "succeeded"},
        ),
        DeliverySpec(
            channel="provider",
            recipient=urls["provider"],
            payload={"to": "oncall@example.test", "body": f"{run_id} done"},
        ),
        DeliverySpec(
            channel="slack", recipient=slack, payload={"text": f":white_check_mark: {done}"}
        ),
        DeliverySpec(channel="email_api", recipient="oncall@example.test", payload=email),
        DeliverySpec(channel="smtp", recipient="oncall@example.test", payload=email),
    ]
    if n % BROWSER_EVERY == 0:
        form = {"title": done, "body": "report ready"}
        specs.append(DeliverySpec(channel="browser", recipient=BROWSER_TARGET, payload=form))
    return specs


async def publish_runs(
    demo: DemoStack,
    tag: str,
    options: DemoOptions,
    published: list[str],
    follow: set[str],
    start: int = 0,
) -> None:
    """Publish ``options.runs`` runs from number ``start``; their keys go into
    ``published`` and ``follow`` (what the observer watches)."""
    async with Publisher(
        demo.settings, producer_name="demo-agent", transactional_id=f"demo-agent-{tag}"
    ) as publisher:
        for n in range(start, start + options.runs):
            run_id = f"demo-{tag}-{n}"
            specs = _specs(run_id, n, demo.urls)
            await publisher.run_started(run_id, agent="demo-agent")
            requests = await publisher.run_succeeded(run_id, f"sha256:{uuid.uuid4().hex}", specs)
            keys = [r.idempotency_key for r in requests]
            follow.update(keys)
            published.extend(keys)
            await asyncio.sleep(1 / options.rate)


async def keep_running(
    demo: DemoStack,
    tag: str,
    options: DemoOptions,
    observer: LedgerObserver,
    out: Console,
) -> None:
    """After the summary (without ``--once``): a run every 2 s until cancelled (Ctrl-C)."""
    out.print("[bold]still running[/]: publishing a run every 2 s; Ctrl-C stops everything")
    trickle = DemoOptions(runs=1, rate=1000.0)
    published: list[str] = []
    n = options.runs
    try:
        while True:
            await publish_runs(demo, tag, trickle, published, observer.only or set(), n)
            n += 1
            for _ in range(6):
                await observer.poll(300)
            out.print(status_line(observer.by_status()), highlight=False)
    except asyncio.CancelledError:
        pass
