"""The options every operator command takes: who acts and why, for the record."""

from __future__ import annotations

from typing import Annotated

import typer

OPERATOR_ENV = "LEDGER_OPERATOR"

Reason = Annotated[
    str | None,
    typer.Option("--reason", help="Why, for the record (required).", show_default=False),
]
OperatorName = Annotated[
    str | None,
    typer.Option(
        "--as",
        envvar=OPERATOR_ENV,
        help="Who acts, for the record (default: LEDGER_OPERATOR).",
        show_default=False,
    ),
]
