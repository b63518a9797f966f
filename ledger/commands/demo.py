"""``ledger demo``: the whole product with faults, in one command (ledger/demo/)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings
from events.errors import LedgerError

out = Console()
app = typer.Typer()


@app.command("demo")
def demo(
    once: Annotated[bool, typer.Option("--once", help="Exit after the summary.")] = False,
    runs: Annotated[int, typer.Option(min=1, help="Runs to publish (3 deliveries each).")] = 40,
) -> None:
    """The whole product with faults: broker, 2 workers, projector, dashboard, fake provider."""
    from ledger.demo.options import DemoOptions
    from ledger.demo.run import run_demo

    summary = run_demo(Settings(), out, DemoOptions(runs=runs, once=once))
    if not summary.ok:
        raise LedgerError(
            "the demo ended with deliveries accepted twice or not settled",
            "see the summary above and the logs in the data dir's demo-logs/",
        )
