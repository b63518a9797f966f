"""The ``ledger`` command line: parse, call the library, print. Errors are one line + a hint."""

from __future__ import annotations

import asyncio
import logging
import sys
import warnings
from importlib.metadata import version as package_version
from typing import Annotated, Any, TextIO

import typer
from rich.console import Console

from clients.publisher import DeliverySpec, Publisher, parse_payload
from config.legacy import DeprecatedSettingWarning
from config.settings import Settings, changed
from events.errors import LedgerError
from ledger import event_loop
from ledger.broker import LocalBroker
from ledger.commands import register_all
from ledger.errors import run_app
from ledger.topics import create_topics

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="delivery-ledger: did the user receive exactly one correct notification?",
)
broker_app = typer.Typer(no_args_is_help=True, help="The local single-node Kafka broker.")
topics_app = typer.Typer(no_args_is_help=True, help="The ledger's Kafka topics.")
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")

out = Console()
err = Console(stderr=True)


def _settings() -> Settings:
    """The settings from the environment; a bad one is reported by ``ledger.errors``."""
    return Settings()


def _version(show: bool) -> None:
    if show:
        out.print(f"delivery-ledger {package_version('delivery-ledger')}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """delivery-ledger: did the user receive exactly one correct notification?"""


@broker_app.command("start")
def broker_start(
    sasl_ssl_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Also listen with SASL_SSL on this port: generated CA, SASL users, ACLs "
            "(LEDGER_KAFKA__BROKER_SASL_SSL_PORT).",
        ),
    ] = None,
) -> None:
    """Start the local broker (downloads Kafka jars with mvn on first use)."""
    settings = _settings()
    if sasl_ssl_port is not None:
        settings = changed(settings, {"kafka.broker_sasl_ssl_port": sasl_ssl_port})
    broker = LocalBroker(settings)
    with err.status("starting Kafka (first run downloads jars with mvn)..."):
        report = broker.start()
    verb = "already running" if report.already_running else f"started in {report.seconds:.1f}s"
    fetched = " (jars downloaded)" if report.downloaded else ""
    out.print(
        f"Kafka {settings.kafka.version} {verb}{fetched}: pid {report.pid}, "
        f"bootstrap {settings.kafka.bootstrap_servers}"
    )
    out.print(f"  data: {report.layout.data}")
    out.print(f"  logs: {report.layout.server_log}")
    if settings.kafka.broker_sasl_ssl_port:
        security = report.layout.security
        out.print(
            f"  SASL_SSL: {settings.kafka.broker_host}:{settings.kafka.broker_sasl_ssl_port}, "
            f"CA {security.ca_file}, users and passwords in {security.users_file}"
        )


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the local broker gracefully (SIGTERM, wait)."""
    pid, seconds, killed = LocalBroker(_settings()).stop()
    if pid is None:
        out.print("no local broker is running")
    elif killed:
        out.print(f"broker {pid} did not stop in time and was killed after {seconds:.1f}s")
    else:
        out.print(f"broker {pid} stopped cleanly in {seconds:.1f}s")


@broker_app.command("status")
def broker_status() -> None:
    """Is the local broker running and answering?"""
    status = LocalBroker(_settings()).status()
    state = "running" if status.running else "not running"
    answer = "answers" if status.reachable else "does not answer"
    out.print(f"local broker: {state}" + (f" (pid {status.pid})" if status.pid else ""))
    out.print(f"{status.bootstrap_servers} {answer} metadata requests")
    out.print(f"data: {status.data_dir}\nlogs: {status.log_file}")
    if not status.reachable:
        raise typer.Exit(3)


@broker_app.command("logs")
def broker_logs(lines: Annotated[int, typer.Option("--lines", "-n", min=1)] = 50) -> None:
    """Print the last lines of the broker's server.log."""
    broker = LocalBroker(_settings())
    log = broker.layout.server_log
    if not log.exists():
        raise LedgerError(
            f"no broker log at {log}", "the local broker has not run with these settings yet"
        )
    tail = broker.log_tail(lines)
    if not tail:
        err.print(f"the broker log {log} is empty", highlight=False, soft_wrap=True)
    for line in tail:
        print(line)


@topics_app.command("create")
def topics_create() -> None:
    """Create ledger.runs, ledger.deliveries and ledger.deadletter (idempotent)."""
    for result in asyncio.run(create_topics(_settings())):
        verb = "created" if result.created else "exists"
        out.print(f"{result.name}: {verb} ({result.partitions} partitions)")


@app.command("publish")
def publish(
    run_id: Annotated[str, typer.Argument(help="The agent run id.")],
    result_hash: Annotated[str, typer.Option("--result-hash", help="Hash of the run's result.")],
    delivery: Annotated[
        list[str], typer.Option("--delivery", "-d", help="CHANNEL:RECIPIENT, repeatable.")
    ],
    payload: Annotated[str, typer.Option(help="JSON payload, or @file.")] = "{}",
) -> None:
    """Publish RunSucceeded and its deliveries in one Kafka transaction."""
    settings = _settings()
    value = parse_payload(payload)
    specs = [DeliverySpec.parse(spec, value) for spec in delivery]
    # Every check before the first connection: bad input never reaches the broker.
    Publisher(settings).check_run_succeeded(run_id, result_hash, specs)

    async def go() -> list[Any]:
        async with Publisher(settings) as publisher:
            return await publisher.run_succeeded(run_id, result_hash, specs)

    requests = event_loop.run(go(), settings)
    out.print(f"run {run_id}: RunSucceeded + {len(requests)} DeliveryRequested committed")
    for request in requests:
        out.print(f"  {request.channel}:{request.recipient} key {request.idempotency_key}")


@app.command("demo")
def demo(
    once: Annotated[bool, typer.Option("--once", help="Exit after the summary.")] = False,
    runs: Annotated[int, typer.Option(min=1, help="Runs to publish (3 deliveries each).")] = 40,
) -> None:
    """The whole product with faults: broker, 2 workers, projector, dashboard, fake provider."""
    from ledger.demo import DemoOptions, run_demo

    summary = run_demo(_settings(), out, DemoOptions(runs=runs, once=once))
    if not summary.ok:
        raise LedgerError(
            "the demo ended with deliveries accepted twice or not settled",
            "see the summary above and the logs in the data dir's demo-logs/",
        )


register_all(app)


_SHOW_WARNING = warnings.showwarning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    # A renamed setting is one line for the operator, not a source location of ours.
    if issubclass(category, DeprecatedSettingWarning):
        print(f"warning: {message}", file=sys.stderr)
        return
    _SHOW_WARNING(message, category, filename, lineno, file, line)


def main() -> None:
    """Console-script entry point: every failure is one line + a hint (``ledger.errors``)."""
    # aiokafka logs every refused connection while we probe for a broker; the CLI
    # reports connection problems itself, in one line.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    # An old flat LEDGER_* name still works; the operator sees, once, what to rename it to
    # (a DeprecationWarning is hidden by default outside __main__).
    warnings.simplefilter("default", DeprecatedSettingWarning)
    warnings.showwarning = _show_warning
    sys.exit(run_app(app))
