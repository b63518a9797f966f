"""``ledger dashboard``: serve the web dashboard over the projection. Thin: parse, serve."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings, changed
from ledger.commands.projections import Dsn
from projections.backends import default_dsn, open_store
from projections.dashboard import check_binding, serve
from projections.database import redacted
from projections.store import Store

out = Console()


app = typer.Typer()


@app.command("dashboard")
def dashboard_command(
    dsn: Dsn = None,
    host: Annotated[
        str | None,
        typer.Option("--host", help="Listen address (default: LEDGER_DASHBOARD__HOST)."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=0,
            max=65535,
            help="Port (default LEDGER_DASHBOARD__PORT, 8765; 0: any free).",
        ),
    ] = None,
) -> None:
    """Serve the dashboard, its JSON API and /metrics until Ctrl-C (reads projections only)."""
    settings = Settings()
    given = {"dashboard.host": host, "dashboard.port": port}
    settings = changed(settings, {k: v for k, v in given.items() if v is not None})
    # Before touching the database: a refusal should be the only thing said.
    check_binding(settings.dashboard)
    target = dsn or default_dsn(settings)
    store = open_store(target)
    try:
        store.prepare("read")
        asyncio.run(_serve(settings, store, redacted(target)))
    finally:
        store.close()
    out.print("dashboard stopped")


async def _serve(settings: Settings, store: Store, shown_dsn: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready(url: str) -> None:
        out.print(f"dashboard on {url} (projection {shown_dsn}); Ctrl-C stops", highlight=False)

    await serve(settings, store, stop, ready=ready)
