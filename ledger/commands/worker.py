"""``ledger worker``: run one delivery worker process (join the consumer group)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from events.settings import Settings


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command."""

    @app.command("worker")
    def worker(
        name: Annotated[
            str, typer.Option(help="Worker name: its local state dir; unique per host.")
        ] = "worker",
        loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "WARNING",
    ) -> None:
        """Claim, send and reconcile deliveries (faust, exactly-once). Ctrl-C stops it."""
        import faust

        from streams.app import create_app

        settings = Settings()
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        built = create_app(settings, name=name)
        print(
            f"ledger worker {built.worker_id}: group {settings.worker_group}, "
            f"topic {settings.topic_deliveries} at {settings.bootstrap_servers}",
            flush=True,
        )
        faust.Worker(built.app, loglevel=loglevel, quiet=True).execute_from_commandline()
