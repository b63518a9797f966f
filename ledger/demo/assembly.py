"""The demo's stack: the fake receivers with their seeded faults, the settings the workers
run with (pointed at those fakes), two workers, the projector and the dashboard."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from config.settings import Settings, WebhookEndpoint, changed, with_channel
from events.retry_policy import RetryPolicy
from ledger.demo.options import (
    BROWSER_TARGET,
    DEMO_EMAIL_API_KEY,
    DEMO_SLACK_CHANNEL,
    DEMO_SLACK_TOKEN,
    DEMO_SLACK_WORKSPACE,
    DemoOptions,
)
from ledger.stack import Child, Stack, read_json_line
from projections.backends import default_dsn

# The sender of the email_api channel's emails (LEDGER_CHANNELS__SETTINGS[email_api]).
DEMO_EMAIL_FROM = "ledger-demo@example.test"
# The sender of the smtp channel's emails (LEDGER_CHANNELS__SETTINGS[smtp]); the relay and
# its IMAP archive are `ledger fake-mail`'s, which prints the rest of the entry.
DEMO_MAIL_FROM = "ledger-demo@example.test"
# A browser attempt takes seconds, so the browser has its own deadline
# (LEDGER_CHANNELS__SEND_DEADLINES) and the lease covers it: lease > longest deadline +
# clock-skew margin.
HTTP_DEADLINE_S = 2.0
BROWSER_DEADLINE_S = 6.0
LEASE_S = 16.0


@dataclass
class DemoStack:
    """What the demo started: the settings its workers run with, the fakes' URLs, the
    workers by name and the dashboard's URL."""

    settings: Settings
    urls: dict[str, Any]
    workers: dict[str, Child]
    dashboard: str


async def assemble(
    settings: Settings, stack: Stack, out: Console, options: DemoOptions
) -> DemoStack:
    """Start the fakes, then the workers, the projector and the dashboard over them."""
    settings, urls = await _start_fakes(settings, stack, options)
    settings = _worker_settings(settings, urls)
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
    return DemoStack(settings, urls, workers, dashboard)


async def _fake(stack: Stack, settings: Settings, args: list[str]) -> dict[str, Any]:
    """Start ``ledger ARGS`` (a fake with ``--json``) and read where it listens."""
    child = stack.start(args[0], args, settings, stdout=subprocess.PIPE)
    return await asyncio.to_thread(read_json_line, child)


async def _start_fakes(
    settings: Settings, stack: Stack, options: DemoOptions
) -> tuple[Settings, dict[str, Any]]:
    """Every fake receiver, each with its seeded faults; the settings that reach them."""
    seed = str(options.seed)
    urls = await _start_provider(stack, settings, seed)
    # Slack's fake: the same fault mix (a late answer after posting, 500 after posting,
    # ratelimited), and no dedupe: a second post is a second message in the history.
    slack_settings = with_channel(
        settings, "slack", {"tokens": {DEMO_SLACK_WORKSPACE: DEMO_SLACK_TOKEN.get_secret_value()}}
    )
    urls["slack_api"] = await _start_slack(stack, slack_settings, seed)
    settings = await _start_email_api(stack, slack_settings, urls)
    settings = await _start_mail(stack, settings, urls, seed)
    settings = await _start_form(stack, settings, urls, seed)
    return settings, urls


async def _start_provider(stack: Stack, settings: Settings, seed: str) -> dict[str, Any]:
    """The fake provider (receiver-kit webhooks, a provider without dedupe); its URLs."""
    return await _fake(
        stack,
        settings,
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
            seed,
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
    )


async def _start_slack(stack: Stack, settings: Settings, seed: str) -> str:
    """The fake Slack Web API; its URL."""
    fake_slack = await _fake(
        stack,
        settings,
        [
            "fake-slack",
            "--port",
            "0",
            "--channel",
            DEMO_SLACK_CHANNEL,
            "--seed",
            seed,
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
    )
    return str(fake_slack["api"])


async def _start_email_api(stack: Stack, settings: Settings, urls: dict[str, Any]) -> Settings:
    # The email API's fake: accepted = SENT, delivered (CONFIRMED by lookup) 0.5 s later;
    # no dedupe, so a second POST would be a second email.
    email = {"api_key": DEMO_EMAIL_API_KEY, "from_address": DEMO_EMAIL_FROM}
    placeholder = {**email, "api_url": "http://127.0.0.1:1"}  # the fake reads only the key
    fake_email = await _fake(
        stack,
        with_channel(settings, "email_api", placeholder),
        ["fake-email-api", "--port", "0", "--deliver-after", "0.5", "--json"],
    )
    urls["email_api"] = fake_email["api"]
    return with_channel(settings, "email_api", {**email, "api_url": urls["email_api"]})


async def _start_mail(
    stack: Stack, settings: Settings, urls: dict[str, Any], seed: str
) -> Settings:
    # The mail fakes: aiosmtpd (stores, then drops the connection before the reply; 421 at
    # RCPT; no dedupe: a second send is a second file in the Maildir) and dovecot serving
    # the relay's archive copy, where the workers' IMAP lookup finds what was stored.
    mail = await _fake(
        stack,
        settings,
        [
            "fake-mail",
            "--port",
            "0",
            "--imap-port",
            "0",
            "--seed",
            seed,
            "--drop-pct",
            "10",
            "--tempfail-pct",
            "5",
            "--json",
        ],
    )
    urls["smtp"], urls["imap"], urls["maildir"] = mail["smtp"], mail["imap"], mail["maildir"]
    return with_channel(settings, "smtp", {**mail["settings"], "from_address": DEMO_MAIL_FROM})


async def _start_form(
    stack: Stack, settings: Settings, urls: dict[str, Any], seed: str
) -> Settings:
    # The browser channel's target: `ledger fake-form` (no dedupe: a second submit is a
    # second accepted entry), with the same kind of seeded fault mix: a confirmation page
    # later than the browser's deadline, a dropped connection or a 500 page after
    # accepting, a 422 rejection.
    form = await _fake(
        stack,
        settings,
        [
            "fake-form",
            "--port",
            "0",
            "--seed",
            seed,
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
    )
    urls["form"], urls["form_accepted"] = form["form"], form["accepted"]
    return with_channel(
        settings, "browser", {"targets": {BROWSER_TARGET: _form_target(urls["form"])}}
    )


def _worker_settings(settings: Settings, urls: dict[str, Any]) -> Settings:
    """The demo's timings, and the fakes on 127.0.0.1 as the workers' endpoints."""
    # The smtp policy waits a minute after a 4xx (greylisting); the demo's 421s cannot.
    smtp_policy = RetryPolicy(base_delay_s=0.5, max_delay_s=2.0)
    settings = with_channel(settings, "slack", {"api_url": urls["slack_api"]})
    return changed(
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
