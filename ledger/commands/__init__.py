"""CLI command groups. Each module here holds a module-level ``app = typer.Typer()`` with
its commands; ledger/cli.py adds them to the root app. Nothing here imports ledger.cli."""
