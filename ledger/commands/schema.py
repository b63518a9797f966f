"""``ledger schema``: the events' JSON Schemas, for producers and consumers in other languages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from events.json_schemas import INDEX, write_schemas
from ledger.errors import UsageError

app = typer.Typer()


@app.command("schema")
def schema(
    out: Annotated[
        Path, typer.Option("--out", help="Directory to write into (created if missing).")
    ] = Path("schemas"),
) -> None:
    """Write a JSON Schema per event type (at the version this ledger writes) and an index
    of them (type, version, topic, file) into DIR; see README, Event schemas."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory", "give a directory")
    try:
        written = write_schemas(out)
    except OSError as exc:
        raise UsageError(
            f"cannot write the schemas into {out}: {exc.strerror or exc}",
            "give --out a directory you can write to",
        ) from None
    typer.echo(f"wrote {len(written) - 1} event schemas and {INDEX} to {out}")
