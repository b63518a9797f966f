"""``ledger worker``: run one delivery worker process (join the consumer group)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command."""

    @app.command("worker")
    def worker(
        name: Annotated[
            str, typer.Option(help="Worker name: its local state dir; unique per host.")
        ] = "worker",
        loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "WARNING",
        data_dir: Annotated[
            Path | None, typer.Option(help="Overrides LEDGER_DATA_DIR for this worker.")
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve Prometheus metrics on 127.0.0.1:PORT.")
        ] = None,
    ) -> None:
        """Claim, send and reconcile deliveries (faust, at-least-once). Ctrl-C stops it."""
        import faust

        from events.kafka_security import ensure_reachable
        from ledger.cli import _settings, guarded
        from streams.app import create_app

        settings = guarded(_settings)
        if data_dir is not None:
            settings = settings.model_copy(update={"data_dir": data_dir})
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        guarded(lambda: ensure_reachable(settings))  # refused: one line, not faust's traceback
        if metrics_port is not None:
            settings = settings.model_copy(update={"worker_metrics_port": metrics_port})
        # A worker that could not sign a webhook (no secret, a bad one) says so in one line.
        built = guarded(lambda: create_app(settings, name=name))
        if settings.worker_metrics_port and built.metrics is not None:
            built.metrics.serve(settings.worker_metrics_host, settings.worker_metrics_port)
            print(
                f"metrics on http://{settings.worker_metrics_host}:"
                f"{settings.worker_metrics_port}/metrics",
                flush=True,
            )
        print(
            f"ledger worker {built.worker_id}: group {settings.worker_group}, "
            f"topic {settings.topic_deliveries} at {settings.bootstrap_servers}",
            flush=True,
        )
        faust.Worker(built.app, loglevel=loglevel, quiet=True).execute_from_commandline()
