"""``ledger demo``: the whole product on embedded defaults, with faults, in one command.

Starts (or reuses) the local broker, creates the topics, starts two ``ledger worker``
processes, ``ledger project``, ``ledger dashboard`` and the fake receivers; publishes runs
with deliveries over every channel (a browser form every ``BROWSER_EVERY`` runs) while the
receivers inject timeouts, 500-after-accept and rejects, and one worker is SIGKILLed
mid-way; then prints what each receiver got.
"""

from __future__ import annotations

import asyncio
import base64
import email.parser
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clients.kafka_security import client_options
from clients.outcome_keys import KEY_DIR, StoredKeys
from clients.publisher import DeliverySpec, Publisher
from config.settings import Settings, WebhookEndpoint, changed, with_channel
from events.retry_policy import RetryPolicy
from ledger import event_loop
from ledger.broker import LocalBroker
from ledger.broker.process import metadata_ok
from ledger.observe import LedgerObserver
from ledger.stack import Child, Stack, read_json_line
from ledger.topics import create_topics
from projections.backends import default_dsn

SETTLE_TIMEOUT_S = 300.0
# The demo's own signing secret, used only when LEDGER_CHANNELS__WEBHOOK_SECRET is unset: the demo
# signs for its own fake provider on 127.0.0.1. Workers have no built-in secret.
DEMO_WEBHOOK_SECRET = SecretStr(
    "whsec_" + base64.b64encode(b"ledger-demo-only-secret-24b").decode()
)
# The fake Slack's workspace, bot token and conversation: the demo's own, on 127.0.0.1.
DEMO_SLACK_WORKSPACE = "demo"
DEMO_SLACK_TOKEN = SecretStr("xoxb-demo-only-token")
DEMO_SLACK_CHANNEL = "C0DEMO0001"
# The fake email API's key and the demo's sender (LEDGER_CHANNELS__SETTINGS[email_api]).
DEMO_EMAIL_API_KEY = "re_demo_only_key"
DEMO_EMAIL_FROM = "ledger-demo@example.test"
# The sender of the smtp channel's emails (LEDGER_CHANNELS__SETTINGS[smtp]); the relay and
# its IMAP archive are `ledger fake-mail`'s, which prints the rest of the entry.
DEMO_MAIL_FROM = "ledger-demo@example.test"
# two webhooks, a provider message, a Slack message, an email by API, an email by SMTP
CHANNELS_PER_RUN = 6
# A form submitted by Chromium every 6th run (from the first): ~7 of the default 40 runs.
# A browser attempt takes seconds, so the browser has its own deadline
# (LEDGER_CHANNELS__SEND_DEADLINES) and the lease covers it: lease > longest deadline +
# clock-skew margin.
BROWSER_EVERY = 6
BROWSER_TARGET = "demo-form"
HTTP_DEADLINE_S = 2.0
BROWSER_DEADLINE_S = 6.0
LEASE_S = 16.0


def deliveries_for(runs: int, start: int = 0) -> int:
    """How many deliveries runs ``start`` .. ``start + runs - 1`` publish."""
    browser = sum(1 for n in range(start, start + runs) if n % BROWSER_EVERY == 0)
    return runs * CHANNELS_PER_RUN + browser


@dataclass
class DemoOptions:
    """What ``ledger demo`` was asked to do."""

    runs: int = 40
    rate: float = 8.0  # runs per second
    once: bool = False
    seed: int = 7


@dataclass
class Summary:
    """The numbers the demo ends with."""

    runs: int
    deliveries: int
    by_status: dict[str, int]
    by_channel: dict[str, dict[str, int]]
    accepted_twice_by_channel: dict[str, int]
    unknowns_reconciled: int
    accepted_twice: int
    repeats_absorbed: int  # POSTs the receiver kit answered as duplicates, not processed
    requests_per_delivery: float
    elapsed_s: float
    dashboard: str
    killed_worker: str | None
    worker_restarts: int = 0

    @property
    def ok(self) -> bool:
        """Nothing accepted twice, every delivery settled or visibly UNKNOWN."""
        open_ = self.by_status.get("PENDING", 0) + self.by_status.get("SENT", 0)
        return self.accepted_twice == 0 and open_ == 0


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
    simulator = stack.start(
        "fake-provider",
        [
            "fake-provider",
            "--port",
            "0",
            "--control-port",
            "0",
            "--hooks",
            "kit",
            "--no-dedupe",
            "--seed",
            str(options.seed),
            "--timeout-pct",
            "10",
            "--error-pct",
            "5",
            "--reject-pct",
            "2",
            "--delay",
            "3",
            "--delivered-after",
            "0.3",
            "--json",
        ],
        settings,
        stdout=subprocess.PIPE,
    )
    urls = await asyncio.to_thread(read_json_line, simulator)
    # Slack's fake: the same fault mix (a late answer after posting, 500 after posting,
    # ratelimited), and no dedupe: a second post is a second message in the history.
    slack_settings = with_channel(
        settings, "slack", {"tokens": {DEMO_SLACK_WORKSPACE: DEMO_SLACK_TOKEN.get_secret_value()}}
    )
    fake_slack = stack.start(
        "fake-slack",
        [
            "fake-slack",
            "--port",
            "0",
            "--channel",
            DEMO_SLACK_CHANNEL,
            "--seed",
            str(options.seed),
            "--timeout-pct",
            "10",
            "--error-pct",
            "5",
            "--ratelimit-pct",
            "3",
            "--delay",
            "3",
            "--json",
        ],
        slack_settings,
        stdout=subprocess.PIPE,
    )
    urls["slack_api"] = (await asyncio.to_thread(read_json_line, fake_slack))["api"]
    # The email API's fake: accepted = SENT, delivered (CONFIRMED by lookup) 0.5 s later;
    # no dedupe, so a second POST would be a second email.
    email = {"api_key": DEMO_EMAIL_API_KEY, "from_address": DEMO_EMAIL_FROM}
    placeholder = {**email, "api_url": "http://127.0.0.1:1"}  # the fake reads only the key
    fake_email = stack.start(
        "fake-email-api",
        ["fake-email-api", "--port", "0", "--deliver-after", "0.5", "--json"],
        with_channel(slack_settings, "email_api", placeholder),
        stdout=subprocess.PIPE,
    )
    urls["email_api"] = (await asyncio.to_thread(read_json_line, fake_email))["api"]
    settings = with_channel(slack_settings, "email_api", {**email, "api_url": urls["email_api"]})
    # The mail fakes: aiosmtpd (stores, then drops the connection before the reply; 421 at
    # RCPT; no dedupe: a second send is a second file in the Maildir) and dovecot serving
    # the relay's archive copy, where the workers' IMAP lookup finds what was stored.
    fake_mail = stack.start(
        "fake-mail",
        [
            "fake-mail",
            "--port",
            "0",
            "--imap-port",
            "0",
            "--seed",
            str(options.seed),
            "--drop-pct",
            "10",
            "--tempfail-pct",
            "5",
            "--json",
        ],
        settings,
        stdout=subprocess.PIPE,
    )
    mail = await asyncio.to_thread(read_json_line, fake_mail)
    urls["smtp"], urls["imap"], urls["maildir"] = mail["smtp"], mail["imap"], mail["maildir"]
    settings = with_channel(settings, "smtp", {**mail["settings"], "from_address": DEMO_MAIL_FROM})
    # The browser channel's target: `ledger fake-form` (no dedupe: a second submit is a
    # second accepted entry), with the same kind of seeded fault mix: a confirmation page
    # later than the browser's deadline, a dropped connection or a 500 page after
    # accepting, a 422 rejection.
    fake_form = stack.start(
        "fake-form",
        [
            "fake-form",
            "--port",
            "0",
            "--seed",
            str(options.seed),
            "--slow-pct",
            "10",
            "--crash-pct",
            "5",
            "--error-pct",
            "5",
            "--reject-pct",
            "5",
            "--delay",
            str(BROWSER_DEADLINE_S + 2),
            "--json",
        ],
        settings,
        stdout=subprocess.PIPE,
    )
    form = await asyncio.to_thread(read_json_line, fake_form)
    urls["form"], urls["form_accepted"] = form["form"], form["accepted"]
    settings = with_channel(
        settings, "browser", {"targets": {BROWSER_TARGET: _form_target(urls["form"])}}
    )
    # The smtp policy waits a minute after a 4xx (greylisting); the demo's 421s cannot.
    smtp_policy = RetryPolicy(base_delay_s=0.5, max_delay_s=2.0)
    settings = with_channel(settings, "slack", {"api_url": urls["slack_api"]})
    settings = changed(
        settings,
        {
            "channels.retry_policies": {**settings.channels.retry_policies, "smtp": smtp_policy},
            "channels.webhook_endpoints": {
                **settings.channels.webhook_endpoints,
                f"{urls['base']}/hooks/": WebhookEndpoint(lookup_url=urls["webhook_lookup"]),
            },
            # The demo's receivers listen on 127.0.0.1: allowed explicitly (SSRF guard).
            "channels.allowed_networks": [*settings.channels.allowed_networks, "127.0.0.0/8"],
            "channels.http_timeout_s": 1.0,
            "channels.send_deadline_s": HTTP_DEADLINE_S,
            "channels.send_deadlines": {
                **settings.channels.send_deadlines,
                "browser": BROWSER_DEADLINE_S,
            },
            "worker.clock_skew_margin_s": 1.0,
            "worker.lookup_settle_s": 3.0,
            "worker.lookup_confirm_spacing_s": 1.5,
            "worker.lease_s": LEASE_S,
        },
    )
    # A second send shows either way: the kit counts it as a repeat it absorbed, the
    # provider (no dedupe) accepts it twice.
    out.print(
        f"[bold]fake provider[/] {urls['base']} · webhooks: receiver-kit apps · provider: no dedupe"
    )
    out.print(f"[bold]fake Slack[/] {urls['slack_api']} · no dedupe")
    out.print(f"[bold]fake email API[/] {urls['email_api']} · no dedupe")
    out.print(
        f"[bold]fake mail[/] smtp {urls['smtp']} (aiosmtpd, no dedupe) · "
        f"imap {urls['imap']} (dovecot over the archive)"
    )
    out.print(
        f"[bold]fake form[/] {urls['form']} (Chromium, no dedupe) · deadlines: browser "
        f"{BROWSER_DEADLINE_S:g} s, the rest {HTTP_DEADLINE_S:g} s · lease {LEASE_S:g} s"
    )
    workers = {
        name: stack.start(name, ["worker", "--name", name], settings)
        for name in ("demo-w1", "demo-w2")
    }
    stack.start("projector", ["project"], settings)
    dashboard = await _start_dashboard(stack, settings)
    out.print(f"[bold]workers[/] demo-w1, demo-w2 · [bold]projector[/] {default_dsn(settings)}")
    out.print(f"[bold]dashboard[/] {dashboard}")
    out.print(f"[dim]logs in {stack.logs}[/]")

    tag = uuid.uuid4().hex[:6]
    began = time.monotonic()
    published: list[str] = []
    killed: str | None = None
    restarts: list[str] = []
    async with LedgerObserver(settings, only=set()) as observer:
        assert observer.only is not None
        publisher_task = asyncio.create_task(
            _publish(settings, urls, tag, options, published, observer.only)
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} settled"),
            TimeElapsedColumn(),
            console=out,
        ) as progress:
            task = progress.add_task("deliveries", total=deliveries_for(options.runs))
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while time.monotonic() < deadline:
                await observer.poll(300)
                counts = observer.by_status()
                progress.update(task, completed=observer.settled, description=_line(counts))
                for name, worker in list(workers.items()):
                    if worker.process.poll() is not None and worker in stack.children:
                        # A supervisor's job: restart it, count it, say so.
                        restarts.append(name)
                        progress.console.print(
                            f"[red]worker {name} exited ({worker.process.returncode})[/]; "
                            f"restarting it (see {worker.log})"
                        )
                        stack.children.remove(worker)
                        workers[name] = stack.start(name, ["worker", "--name", name], settings)
                if killed is None and observer.settled >= deliveries_for(options.runs) * 0.4:
                    killed = "demo-w1"
                    stack.kill(workers[killed])
                    progress.console.print(
                        f"[yellow]SIGKILL[/] {killed} mid-run (a crash); "
                        "restarting it: its leases expire and lookups settle "
                        "what it had in flight"
                    )
                    workers[killed] = stack.start(killed, ["worker", "--name", killed], settings)
                if publisher_task.done() and observer.settled >= len(published):
                    break
        await publisher_task
        summary = _summary(observer, options.runs, published, urls, began, dashboard, killed)
        summary.worker_restarts = len(restarts)
        _print_summary(out, summary)
        if not options.once:
            await _keep_running(settings, urls, tag, options, observer, out)
            summary = _summary(observer, options.runs, published, urls, began, dashboard, killed)
    return summary


async def _start_dashboard(stack: Stack, settings: Settings) -> str:
    # The dashboard reads the projection: wait until the projector has created it.
    target = Path(default_dsn(settings).removeprefix("sqlite://"))
    for _ in range(100):
        if await asyncio.to_thread(target.exists):
            break
        await asyncio.sleep(0.1)
    child = stack.start("dashboard", ["dashboard", "--port", "0"], settings)
    return await asyncio.to_thread(_dashboard_url, child)


def _dashboard_url(child: Child) -> str:
    for _ in range(150):
        for line in child.log.read_text(errors="replace").splitlines():
            if "dashboard on http" in line:
                return line.split("dashboard on ", 1)[1].split()[0]
        if not child.alive():
            break
        time.sleep(0.1)
    return f"(dashboard did not start: see {child.log})"


async def _publish(
    settings: Settings,
    urls: dict[str, Any],
    tag: str,
    options: DemoOptions,
    published: list[str],
    follow: set[str],
    start: int = 0,
) -> None:
    async with Publisher(
        settings, producer_name="demo-agent", transactional_id=f"demo-agent-{tag}"
    ) as publisher:
        for n in range(start, start + options.runs):
            run_id = f"demo-{tag}-{n}"
            specs = [
                DeliverySpec(
                    channel="webhook",
                    recipient=f"{urls['base']}/hooks/ops",
                    payload={"text": f"run {run_id} finished"},
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
                    channel="slack",
                    recipient=f"{DEMO_SLACK_WORKSPACE}/{DEMO_SLACK_CHANNEL}",
                    payload={"text": f":white_check_mark: run {run_id} finished"},
                ),
                DeliverySpec(
                    channel="email_api",
                    recipient="oncall@example.test",
                    payload={"subject": f"run {run_id} finished", "text": "report ready"},
                ),
                DeliverySpec(
                    channel="smtp",
                    recipient="oncall@example.test",
                    payload={"subject": f"run {run_id} finished", "text": "report ready"},
                ),
            ]
            if n % BROWSER_EVERY == 0:
                specs.append(
                    DeliverySpec(
                        channel="browser",
                        recipient=BROWSER_TARGET,
                        payload={"title": f"run {run_id} finished", "body": "report ready"},
                    )
                )
            await publisher.run_started(run_id, agent="demo-agent")
            requests = await publisher.run_succeeded(run_id, f"sha256:{uuid.uuid4().hex}", specs)
            keys = [r.idempotency_key for r in requests]
            follow.update(keys)
            published.extend(keys)
            await asyncio.sleep(1 / options.rate)


async def _keep_running(
    settings: Settings,
    urls: dict[str, Any],
    tag: str,
    options: DemoOptions,
    observer: LedgerObserver,
    out: Console,
) -> None:
    out.print("[bold]still running[/]: publishing a run every 2 s; Ctrl-C stops everything")
    trickle = DemoOptions(runs=1, rate=1000.0)
    published: list[str] = []
    n = options.runs
    try:
        while True:
            await _publish(settings, urls, tag, trickle, published, observer.only or set(), n)
            n += 1
            for _ in range(6):
                await observer.poll(300)
            out.print(_line(observer.by_status()), highlight=False)
    except asyncio.CancelledError:
        pass


def _line(counts: Any) -> str:
    order = ("CONFIRMED", "FAILED", "UNKNOWN", "SENT", "PENDING")
    return " ".join(f"{name.lower()} {counts.get(name, 0)}" for name in order)


def _summary(
    observer: LedgerObserver,
    runs: int,
    published: list[str],
    urls: dict[str, Any],
    began: float,
    dashboard: str,
    killed: str | None,
) -> Summary:
    state = httpx.get(f"{urls['control']}/state", timeout=30).json()
    mine = set(published)
    posts = sum(1 for r in state["requests"] if r["method"] == "POST" and r["key"] in mine)
    repeats = sum(1 for r in state["requests"] if r["key"] in mine and r["result"] == "duplicate")
    twice_by_channel: dict[str, int] = {}
    for key, seen in state["events"].items():
        if key in mine and seen["accepted"] > 1:
            channel = observer.states[key].channel if key in observer.states else "provider"
            twice_by_channel[channel] = twice_by_channel.get(channel, 0) + 1
    slack_messages = _slack_messages_per_key(urls["slack_api"])
    posts += sum(n for key, n in slack_messages.items() if key in mine)
    twice_by_channel["slack"] = sum(1 for k, n in slack_messages.items() if k in mine and n > 1)
    emails = _emails_per_key(urls["email_api"], _keys_of(observer, mine, "email_api"))
    posts += sum(emails.values())
    twice_by_channel["email_api"] = sum(1 for n in emails.values() if n > 1)
    mails = _mails_per_key(Path(urls["maildir"]))
    posts += sum(n for key, n in mails.items() if key in mine)
    twice_by_channel["smtp"] = sum(1 for k, n in mails.items() if k in mine and n > 1)
    forms = _forms_per_key(urls["form_accepted"], _keys_of(observer, mine, "browser"))
    posts += sum(forms.values())
    twice_by_channel["browser"] = sum(1 for n in forms.values() if n > 1)
    twice = sum(twice_by_channel.values())
    return Summary(
        runs=runs,
        deliveries=len(published),
        by_status=dict(observer.by_status()),
        by_channel={name: dict(counts) for name, counts in observer.by_channel().items()},
        accepted_twice_by_channel=twice_by_channel,
        unknowns_reconciled=observer.unknowns_reconciled(),
        accepted_twice=twice,
        repeats_absorbed=repeats,
        requests_per_delivery=posts / max(1, len(published)),
        elapsed_s=time.monotonic() - began,
        dashboard=dashboard,
        killed_worker=killed,
    )


def _keys_of(observer: LedgerObserver, mine: set[str], channel: str) -> list[str]:
    return [k for k, st in observer.states.items() if k in mine and st.channel == channel]


def _form_target(form_url: str) -> dict[str, Any]:
    """The fake form as a browser target (LEDGER_CHANNELS__SETTINGS[browser].targets)."""
    base = form_url.removesuffix("/form")
    return {
        "start_url": form_url,
        "steps": [{"fill": "#title", "field": "title"}, {"fill": "#body", "field": "body"}],
        "key": {"input": "#idempotency-key"},
        "fencing_token": {"input": "#fencing-token"},
        "submit": "#submit",
        "confirmation": {"selector": "#confirmation", "attribute": "data-id"},
        "errors": [
            {"selector": "#rejected", "outcome": "rejected"},
            {"selector": "#stale", "outcome": "rejected"},
            {"selector": "#error", "outcome": "unknown"},
        ],
        "lookup": {"url": f"{base}/accepted?key={{key}}"},
    }


def _forms_per_key(accepted_url: str, keys: list[str]) -> Counter[str]:
    """Submissions the fake form accepted per idempotency key (its list by key: it does
    not dedupe, so a second submit is a second entry)."""
    found: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for key in keys:
            listed = client.get(accepted_url, params={"key": key}).json()["accepted"]
            if listed:
                found[key] = len(listed)
    return found


def _slack_messages_per_key(api: str) -> Counter[str]:
    """Messages per idempotency key in the demo's conversation, read as a user would:
    conversations.history with metadata, every page (bounded)."""
    found: Counter[str] = Counter()
    cursor = ""
    with httpx.Client(
        base_url=api, headers={"Authorization": f"Bearer {DEMO_SLACK_TOKEN.get_secret_value()}"}
    ) as client:
        for _ in range(1000):
            answer = client.post(
                "conversations.history",
                data={
                    "channel": DEMO_SLACK_CHANNEL,
                    "include_all_metadata": "true",
                    "limit": "200",
                    "cursor": cursor,
                },
                timeout=30,
            ).json()
            for message in answer.get("messages", []):
                payload = (message.get("metadata") or {}).get("event_payload") or {}
                if isinstance(payload.get("idempotency_key"), str):
                    found[payload["idempotency_key"]] += 1
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or ""
            if not answer.get("has_more") or not cursor:
                break
    return found


def _mails_per_key(maildir: Path) -> Counter[str]:
    """Messages per idempotency key in the fake relay's Maildir, read as a user would:
    every file in new/ and cur/, its Message-ID ``<KEY@DOMAIN>`` parsed."""
    found: Counter[str] = Counter()
    parser = email.parser.BytesHeaderParser()
    for folder in ("new", "cur"):
        for path in sorted((maildir / folder).glob("*")):
            with path.open("rb") as message:
                message_id = str(parser.parse(message)["Message-ID"] or "").strip()
            key, at, _domain = message_id.removeprefix("<").removesuffix(">").rpartition("@")
            if at:
                found[key] += 1
    return found


def _emails_per_key(api: str, keys: list[str]) -> Counter[str]:
    """Emails the fake accepted per idempotency key (its lookup by key, and its own
    count header), for the keys the demo published."""
    found: Counter[str] = Counter()
    auth = {"Authorization": f"Bearer {DEMO_EMAIL_API_KEY}"}
    with httpx.Client(base_url=api, headers=auth, timeout=30) as client:
        for key in keys:
            answer = client.get("emails", params={"idempotency_key": key})
            if answer.status_code == 200:
                found[key] = int(answer.headers.get("X-Fake-Messages-With-Key", "1"))
    return found


def _print_summary(out: Console, summary: Summary) -> None:
    table = Table(title="delivery-ledger demo", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("runs", str(summary.runs))
    table.add_row("deliveries", str(summary.deliveries))
    for status in ("CONFIRMED", "FAILED", "UNKNOWN", "SENT", "PENDING"):
        table.add_row(f"  {status}", str(summary.by_status.get(status, 0)))
    table.add_row("unknowns reconciled by lookup", str(summary.unknowns_reconciled))
    style = "green" if summary.accepted_twice == 0 else "bold red"
    table.add_row(
        "logical events the receiver accepted twice", f"[{style}]{summary.accepted_twice}[/]"
    )
    style = "green" if summary.repeats_absorbed == 0 else "yellow"
    table.add_row(
        "second sends the receiver kit absorbed", f"[{style}]{summary.repeats_absorbed}[/]"
    )
    table.add_row("requests per delivery", f"{summary.requests_per_delivery:.2f}")
    table.add_row("worker SIGKILLed mid-run", summary.killed_worker or "-")
    table.add_row("workers that exited and were restarted", str(summary.worker_restarts))
    table.add_row("elapsed", f"{summary.elapsed_s:.1f} s")
    table.add_row("dashboard", summary.dashboard)
    out.print(table)
    statuses = ("CONFIRMED", "FAILED", "UNKNOWN", "SENT", "PENDING")
    channels = Table(title="by channel, each counted at its own receiver")
    channels.add_column("channel")
    for status in statuses:
        channels.add_column(status.lower(), justify="right")
    channels.add_column("accepted twice", justify="right")
    for channel, counts in sorted(summary.by_channel.items()):
        twice = summary.accepted_twice_by_channel.get(channel, 0)
        style = "green" if twice == 0 else "bold red"
        cells = [str(counts.get(status, 0)) for status in statuses]
        channels.add_row(channel, *cells, f"[{style}]{twice}[/]")
    out.print(channels)
