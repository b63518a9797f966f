"""``ledger mcp``: serve the ledger to agents over the Model Context Protocol
(ledger/mcp_server). Thin: parse, serve."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from clients.operator_actions import check_operator
from config.settings import Settings
from events.base import check_run_id
from events.errors import LedgerError
from ledger import event_loop
from ledger.commands.serving import stop_on_signals
from ledger.errors import UsageError

app = typer.Typer()


@app.command("mcp")
def mcp_command(
    http: Annotated[
        bool,
        typer.Option("--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio."),
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="With --http (0: any free port).")
    ] = 0,
    agent: Annotated[
        str, typer.Option("--agent", help="The agent the runs are published as.")
    ] = "mcp-agent",
    operators: Annotated[
        list[str] | None,
        typer.Option(
            "--operator",
            help="Turn on resolve and redrive for this operator (repeatable); each call "
            "names its operator, one of these.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the ledger's tools to an agent's MCP client (stdio by default)."""
    try:
        agent = check_run_id(agent)  # the same safe characters as a run id
    except ValueError:
        raise UsageError(
            "--agent must be 1-200 letters, digits and ._-/@+=", "name the agent plainly"
        ) from None
    names = tuple(check_operator(name) for name in operators or ())
    if not http and port:
        raise UsageError("--port goes with --http", "add --http, or drop --port")
    settings = Settings()
    from ledger.mcp_server import LedgerTools, serve_http, serve_stdio  # the SDK: here only

    tools = LedgerTools(settings, agent=agent, operators=names)
    if not http:
        event_loop.run(serve_stdio(tools), settings)
        return

    async def serving() -> None:
        def ready(url: str) -> None:
            # stderr: stdout stays free for whatever the caller pipes
            print(f"mcp on {url} (streamable HTTP); Ctrl-C stops", file=sys.stderr, flush=True)

        await serve_http(tools, port, stop_on_signals(), ready=ready)

    try:
        event_loop.run(serving(), settings)
    except OSError as exc:
        raise LedgerError(
            f"cannot listen: {exc.strerror or exc}", "choose another with --port"
        ) from None
