"""``ledger api-keys create|list|revoke``: the HTTP API's keys, as events on
``ledger.api_keys`` (clients/api_keys.py). The secret is printed once and kept nowhere."""

from __future__ import annotations

import asyncio
import getpass
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clients.api_keys import issue_key, read_keys, revoke_key
from config.settings import Settings
from ledger.commands.operator_options import OperatorName
from ledger.errors import UsageError

out = Console(highlight=False)
app = typer.Typer(no_args_is_help=True, help="API keys of the HTTP ingest API ('ledger api').")


def _actor(name: str | None) -> str:
    actor = name or getpass.getuser()
    if not actor or len(actor) > 200:
        raise UsageError("--as must be 1-200 characters", "name who acts, for the record")
    return actor


@app.command("create")
def create(
    agent: Annotated[
        str,
        typer.Option("--agent", help="The agent the key speaks for (the producer budgets count)."),
    ],
    operator: OperatorName = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Issue a key for AGENT; its token is printed once (only its SHA-256 is logged)."""
    if not agent or len(agent) > 200:
        raise UsageError("--agent must be 1-200 characters", "the agent's name, as budgets know it")
    key, token = asyncio.run(issue_key(Settings().kafka, agent, _actor(operator)))
    if as_json:
        out.print(json.dumps({"key_id": key.key_id, "agent": key.agent, "token": token}))
        return
    out.print(f"API key {key.key_id} for agent {key.agent}:")
    out.print(token)
    out.print("shown once: store it now (only its SHA-256 is kept)")


@app.command("list")
def list_keys(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Every key: its id, agent, when it was issued and by whom, and whether revoked."""
    keys = asyncio.run(read_keys(Settings().kafka))
    rows = sorted(keys.values(), key=lambda k: (k.agent, k.issued_at))
    if as_json:
        shown = [k.model_dump(mode="json", exclude={"secret_sha256"}) for k in rows]
        out.print(json.dumps(shown))
        return
    table = Table("key id", "agent", "issued", "by", "revoked")
    for k in rows:
        revoked = f"{k.revoked_at:%Y-%m-%d %H:%M} by {k.revoked_by}" if k.revoked_at else ""
        table.add_row(k.key_id, k.agent, f"{k.issued_at:%Y-%m-%d %H:%M}", k.issued_by, revoked)
    out.print(table)


@app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key id ('ledger api-keys list').")],
    operator: OperatorName = None,
) -> None:
    """Revoke a key: requests with it are refused (401) as soon as the API reads it."""
    key = asyncio.run(revoke_key(Settings().kafka, key_id, _actor(operator)))
    out.print(f"API key {key.key_id} of agent {key.agent} revoked")
