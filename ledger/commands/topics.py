"""``ledger topics create``: the ledger's Kafka topics (ledger/topics.py)."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console

from config.settings import Settings
from ledger.topics import create_topics

out = Console()
app = typer.Typer(no_args_is_help=True, help="The ledger's Kafka topics.")


@app.command("create")
def topics_create() -> None:
    """Create ledger.runs, ledger.deliveries and ledger.deadletter (idempotent)."""
    for result in asyncio.run(create_topics(Settings())):
        verb = "created" if result.created else "exists"
        out.print(f"{result.name}: {verb} ({result.partitions} partitions)")
