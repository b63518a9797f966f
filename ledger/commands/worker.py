"""``ledger worker``: run one delivery worker process (join the consumer group)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, cast

import typer

app = typer.Typer()


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
        int | None,
        typer.Option(min=1, max=65535, help="Serve Prometheus metrics on 127.0.0.1:PORT."),
    ] = None,
) -> None:
    """Claim, send and reconcile deliveries (faust, at-least-once). Ctrl-C stops it."""
    from config.settings import Settings, changed
    from ledger import event_loop
    from ledger.topics import resolved_replication
    from streams.app import create_app
    from streams.topic_layout import changelog_topic, check_topic_layout

    if loglevel.upper() not in logging.getLevelNamesMapping():
        raise typer.BadParameter(
            f"{loglevel!r} is not a log level (DEBUG, INFO, WARNING, ERROR)",
            param_hint="'--loglevel'",
        )
    settings = Settings()
    if data_dir is not None:
        settings = changed(settings, {"data_dir": data_dir})
    if metrics_port is not None:
        settings = changed(settings, {"worker.metrics_port": metrics_port})
    # Before the app exists: faust and mode take their loop from the policy.
    loop_name = event_loop.install(settings)
    # Settings and secrets are checked (create_app) before the first connection; a
    # broker that refuses us (or none) is one line, not faust's traceback.
    built = create_app(settings, name=name)
    # A changelog left by another partition layout is one line here, not faust's crash.
    check_topic_layout(settings.kafka, changelog_topic(settings.worker.group))
    # The changelog is replicated as the ledger's topics are on this cluster.
    replication = asyncio.run(resolved_replication(settings.kafka))
    built.replicate(replication.factor, replication.min_insync)
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    if settings.worker.metrics_port and built.metrics is not None:
        built.metrics.serve(settings.worker.metrics_host, settings.worker.metrics_port)
        print(
            f"metrics on http://{settings.worker.metrics_host}:"
            f"{settings.worker.metrics_port}/metrics",
            flush=True,
        )
    print(
        f"ledger worker {built.worker_id}: group {settings.worker.group}, "
        f"topic {settings.kafka.topic_deliveries} at {settings.kafka.bootstrap_servers}, "
        f"{loop_name} loop",
        flush=True,
    )
    _run(built.app, loglevel)


def _logging_config() -> dict[str, Any]:
    """mode's coloured log format, coloured only when stderr (where the logs go) is a terminal.

    mode decides colour from stdout, so ``ledger worker 2>worker.log`` run from a
    terminal wrote colour codes into the file.
    """
    from mode.utils.logging import DEFAULT_FORMATTERS

    colored: dict[str, Any] = dict(cast("dict[str, Any]", DEFAULT_FORMATTERS["colored"]))
    colored["stream"] = sys.stderr
    return {"merge": True, "formatters": {"colored": colored}}


def _run(app: Any, loglevel: str) -> None:
    import faust
    from mode.utils import logging as mode_logging

    class Worker(faust.Worker):
        """faust's worker, with terminal codes only where a terminal reads them."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The spinner hides and shows the cursor with control codes even off a terminal.
            if not self.stdout.isatty():
                self.spinner = None

        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            super().on_setup_root_logger(logger, level)
            # mode draws its log tables with line-drawing codes when *stdout* is a
            # terminal; the logs go to stderr.
            mode_logging.LOG_ISATTY = sys.stderr.isatty()

    worker = Worker(app, loglevel=loglevel, quiet=True, logging_config=_logging_config())
    worker.execute_from_commandline()
