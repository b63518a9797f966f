"""``ledger init`` and ``ledger outcome-keys``: the Ed25519 pair of signed outcome events."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer

from clients.outcome_keys import StoredKeys
from clients.outcome_signing import new_pair
from config.settings import Settings

app = typer.Typer()


@app.command("init")
def init() -> None:
    """Set up a new installation's data directory: an outcome signing pair and an operator
    signing pair in DATA_DIR/keys (directory 0700, files 0600), each kept if already there."""
    settings = Settings()
    stored = StoredKeys.of(settings.data_dir)
    created = stored.create()
    what = "wrote new signing pairs" if created else "kept the signing pairs"
    typer.echo(
        f"{what} in {stored.directory} (workers sign outcomes, operators sign resolve and "
        "redrive, readers verify both)"
    )


@app.command("outcome-keys")
def outcome_keys(
    shape: Annotated[
        Literal["env", "json"], typer.Option("--format", help="env (default) or json.")
    ] = "env",
) -> None:
    """Print a new signing key (workers only: keep it secret) and its verify key (every
    reader), as LEDGER_ variables; see README, Security."""
    signing, verify = new_pair()
    if shape == "json":
        typer.echo(json.dumps({"signing_key": signing, "verify_key": verify}))
        return
    typer.echo(f"LEDGER_SIGNING__SIGNING_KEY={signing}")
    typer.echo(f"LEDGER_SIGNING__VERIFY_KEYS='[\"{verify}\"]'")
