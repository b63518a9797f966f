"""``ledger api``: serve the HTTP ingest API (api/). Thin: parse, serve."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger import event_loop
from ledger.commands.serving import stop_on_signals

out = Console(highlight=False)
app = typer.Typer()


@app.command("api")
def api_command(
    host: Annotated[
        str | None, typer.Option("--host", help="Listen address (default: LEDGER_API__HOST).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", min=0, max=65535, help="Port (default LEDGER_API__PORT, 8780; 0: any free)."
        ),
    ] = None,
    dsn: Annotated[
        str | None,
        typer.Option(
            "--dsn",
            help="The API's idempotency database, sqlite:///path or postgresql://... "
            "(LEDGER_API__DSN).",
        ),
    ] = None,
) -> None:
    """Serve the HTTP ingest API (OpenAPI at /openapi.json) until Ctrl-C."""
    given = {"api.host": host, "api.port": port, "api.dsn": dsn}
    settings = changed(Settings(), {k: v for k, v in given.items() if v is not None})
    from api import serve  # FastAPI is loaded by this command only

    async def serving() -> tuple[int, int]:
        stop = stop_on_signals()

        def ready(url: str) -> None:
            out.print(f"api on {url} (OpenAPI at {url}/openapi.json); Ctrl-C stops")

        return await serve(settings, stop, ready=ready)

    try:  # LEDGER_EVENT_LOOP, as the worker's
        runs, transactions = event_loop.run(serving(), settings)
    except OSError as exc:
        raise LedgerError(
            f"cannot listen: {exc.strerror or exc}",
            "choose another with --port or LEDGER_API__PORT",
        ) from None
    out.print(f"api stopped ({runs:,} runs in {transactions:,} Kafka transactions)")
