"""``ledger outcome-keys``: a fresh Ed25519 pair for signed outcome events."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import typer

from events.outcome_signing import new_pair


def register(app: typer.Typer) -> None:
    """Add the ``outcome-keys`` command."""

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
        typer.echo(f"LEDGER_OUTCOME_SIGNING_KEY={signing}")
        typer.echo(f"LEDGER_OUTCOME_VERIFY_KEYS='[\"{verify}\"]'")
