"""``ledger api``: serve the HTTP ingest API (api/). Thin: parse, serve."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Annotated, Any

import typer
from rich.console import Console

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger import event_loop
from ledger.commands.serving import serve_together, stop_on_signals
from projections.backends import default_dsn, open_store
from projections.database import redacted
from projections.store import Store

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
    with_dashboard: Annotated[
        bool,
        typer.Option(
            "--with-dashboard",
            help="Also serve the dashboard in this process, on its own address "
            "(LEDGER_DASHBOARD__HOST/PORT), over the projection (LEDGER_PROJECTION__DSN).",
        ),
    ] = False,
) -> None:
    """Serve the HTTP ingest API (OpenAPI at /openapi.json) until Ctrl-C."""
    given = {"api.host": host, "api.port": port, "api.dsn": dsn}
    settings = changed(Settings(), {k: v for k, v in given.items() if v is not None})
    from api import serve  # FastAPI is loaded by this command only
    from projections.dashboard import check_binding
    from projections.dashboard import serve as serve_dashboard

    store: Store | None = None
    if with_dashboard:
        # Refused before anything listens, as 'ledger dashboard' refuses.
        check_binding(settings.dashboard)
        store = open_store(default_dsn(settings))

    async def serving() -> tuple[int, int]:
        stop = stop_on_signals()

        def ready(url: str) -> None:
            out.print(f"api on {url} (OpenAPI at {url}/openapi.json); Ctrl-C stops")

        def dashboard_ready(url: str) -> None:
            shown = redacted(default_dsn(settings))
            out.print(f"dashboard on {url} (projection {shown})")

        servers: list[Coroutine[Any, Any, Any]] = [serve(settings, stop, ready=ready)]
        if store is not None:
            servers.append(serve_dashboard(settings, store, stop, ready=dashboard_ready))
        counts: tuple[int, int] = (await serve_together(stop, *servers))[0]
        return counts

    try:
        if store is not None:
            store.prepare("read")
        # LEDGER_EVENT_LOOP, as the worker's
        runs, transactions = event_loop.run(serving(), settings)
    except OSError as exc:
        raise LedgerError(
            f"cannot listen: {exc.strerror or exc}",
            "choose another with --port or LEDGER_API__PORT (the dashboard's: "
            "LEDGER_DASHBOARD__PORT)",
        ) from None
    finally:
        if store is not None:
            store.close()
    out.print(f"api stopped ({runs:,} runs in {transactions:,} Kafka transactions)")
