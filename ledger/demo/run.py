"""``run_demo``: the broker (started or reused), the topics, the stack, the runs under
chaos, the summary; everything the demo started is stopped at the end."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid

from pydantic import SecretStr
from rich.console import Console

from clients.kafka_security import client_options
from clients.outcome_keys import KEY_DIR, StoredKeys
from config.settings import Settings, changed
from ledger import event_loop
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.demo.assembly import assemble
from ledger.demo.chaos import Chaos, settle
from ledger.demo.options import DemoOptions
from ledger.demo.runs import keep_running, publish_runs
from ledger.demo.summary import Summary, print_summary, summarize
from ledger.observe import LedgerObserver
from ledger.stack import Stack
from ledger.topics import create_topics

# The demo's own signing secret, used only when LEDGER_CHANNELS__WEBHOOK_SECRET is unset: the demo
# signs for its own fake provider on 127.0.0.1. Workers have no built-in secret.
DEMO_WEBHOOK_SECRET = SecretStr(
    "whsec_" + base64.b64encode(b"ledger-demo-only-secret-24b").decode()
)


def run_demo(settings: Settings, out: Console, options: DemoOptions | None = None) -> Summary:
    """Run the demo; returns the summary (printed too). Stops everything it started."""
    options = options or DemoOptions()
    if settings.channels.webhook_secret is None:
        settings = changed(settings, {"channels.webhook_secret": DEMO_WEBHOOK_SECRET})
    if settings.signing.outcomes and StoredKeys.of(settings.data_dir).create():
        # What 'ledger init' does: the demo's workers sign, its projector verifies.
        out.print(f"[bold]keys[/] a new outcome signing pair in {settings.data_dir / KEY_DIR}")
    broker = LocalBroker(settings)
    started = False
    if metadata_ok(
        settings.kafka.bootstrap_servers, timeout=3.0, options=client_options(settings.kafka)
    ):
        out.print(f"[bold]broker[/] {settings.kafka.bootstrap_servers} reused")
    else:
        with out.status("starting the local Kafka broker..."):
            report = broker.start()
        started = not report.already_running
        out.print(
            f"[bold]broker[/] {settings.kafka.bootstrap_servers} started in {report.seconds:.1f}s"
        )
    stack = Stack(settings.data_dir / "demo-logs" / time.strftime("%Y%m%d-%H%M%S"))
    try:
        asyncio.run(create_topics(settings))
        return event_loop.run(_demo(settings, stack, out, options), settings)
    finally:
        killed = stack.stop()
        if killed:
            out.print(f"had to SIGKILL {', '.join(killed)} on shutdown")
        if started:
            broker.stop()
            out.print("broker stopped (the demo started it)")
        else:
            out.print("every process the demo started is stopped; the broker keeps running")


async def _demo(settings: Settings, stack: Stack, out: Console, options: DemoOptions) -> Summary:
    demo = await assemble(settings, stack, out, options)
    settings, urls = demo.settings, demo.urls
    tag = uuid.uuid4().hex[:6]
    began = time.monotonic()
    published: list[str] = []
    chaos = Chaos(stack, demo)
    async with LedgerObserver(settings, only=set()) as observer:
        assert observer.only is not None
        publishing = asyncio.create_task(publish_runs(demo, tag, options, published, observer.only))
        await settle(chaos, observer, out, options.runs, publishing, published)
        summary = summarize(
            observer, options.runs, published, urls, began, demo.dashboard, chaos.killed
        )
        summary.worker_restarts = len(chaos.restarts)
        print_summary(out, summary)
        if not options.once:
            await keep_running(demo, tag, options, observer, out)
            summary = summarize(
                observer, options.runs, published, urls, began, demo.dashboard, chaos.killed
            )
    return summary
