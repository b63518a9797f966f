"""The numbers the demo ends with: deliveries by status and channel, as the log tells
them, and what each receiver accepted twice, as the receivers tell it; printed as tables."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from ledger.demo.receipts import (
    emails_per_key,
    forms_per_key,
    mails_per_key,
    slack_messages_per_key,
)
from ledger.observe import LedgerObserver

STATUSES = ("CONFIRMED", "FAILED", "UNKNOWN", "SENT", "PENDING")


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


def status_line(counts: Any) -> str:
    """Deliveries by status, on one line."""
    return " ".join(f"{name.lower()} {counts.get(name, 0)}" for name in STATUSES)


def summarize(
    observer: LedgerObserver,
    runs: int,
    published: list[str],
    urls: dict[str, Any],
    began: float,
    dashboard: str,
    killed: str | None,
) -> Summary:
    """The log's counts (``observer``) beside what every fake receiver accepted."""
    state = httpx.get(f"{urls['control']}/state", timeout=30).json()
    mine = set(published)
    posts = sum(1 for r in state["requests"] if r["method"] == "POST" and r["key"] in mine)
    repeats = sum(1 for r in state["requests"] if r["key"] in mine and r["result"] == "duplicate")
    twice_by_channel: dict[str, int] = {}
    for key, seen in state["events"].items():
        if key in mine and seen["accepted"] > 1:
            channel = observer.states[key].channel if key in observer.states else "provider"
            twice_by_channel[channel] = twice_by_channel.get(channel, 0) + 1
    slack_messages = slack_messages_per_key(urls["slack_api"])
    posts += sum(n for key, n in slack_messages.items() if key in mine)
    twice_by_channel["slack"] = sum(1 for k, n in slack_messages.items() if k in mine and n > 1)
    emails = emails_per_key(urls["email_api"], _keys_of(observer, mine, "email_api"))
    posts += sum(emails.values())
    twice_by_channel["email_api"] = sum(1 for n in emails.values() if n > 1)
    mails = mails_per_key(Path(urls["maildir"]))
    posts += sum(n for key, n in mails.items() if key in mine)
    twice_by_channel["smtp"] = sum(1 for k, n in mails.items() if k in mine and n > 1)
    forms = forms_per_key(urls["form_accepted"], _keys_of(observer, mine, "browser"))
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


def print_summary(out: Console, summary: Summary) -> None:
    """The summary as two tables: the totals, then by channel."""
    table = Table(title="delivery-ledger demo", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("runs", str(summary.runs))
    table.add_row("deliveries", str(summary.deliveries))
    for status in STATUSES:
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
    channels = Table(title="by channel, each counted at its own receiver")
    channels.add_column("channel")
    for status in STATUSES:
        channels.add_column(status.lower(), justify="right")
    channels.add_column("accepted twice", justify="right")
    for channel, counts in sorted(summary.by_channel.items()):
        twice = summary.accepted_twice_by_channel.get(channel, 0)
        style = "green" if twice == 0 else "bold red"
        cells = [str(counts.get(status, 0)) for status in STATUSES]
        channels.add_row(channel, *cells, f"[{style}]{twice}[/]")
    out.print(channels)
