"""The ``ledger`` command line: parse, call the library, print. Errors are one line + a hint."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console

from events.errors import LedgerError
from events.publisher import DeliverySpec, Publisher, PublishRejected, parse_payload
from events.settings import Settings
from ledger.broker import LocalBroker
from ledger.commands import register_all
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
T = TypeVar("T")


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        text = str(problem["msg"]).removeprefix("Value error, ")
        line = f"invalid LEDGER_ settings: {where + ': ' if where else ''}{text}"
        raise LedgerError(line, "check the LEDGER_* environment variables") from None
    except Exception as exc:  # noqa: BLE001 - pydantic-settings raises several kinds
        first = f"invalid LEDGER_ settings: {exc}".splitlines()[0]
        raise LedgerError(first, "check the LEDGER_* environment variables") from None


def guarded(func: Callable[[], T]) -> T:
    """Run a command body, turning known errors into one line plus a hint and exit 1."""
    try:
        return func()
    except LedgerError as exc:
        err.print(f"[bold red]error:[/] {exc.message}", highlight=False, soft_wrap=True)
        if exc.hint:
            err.print(f"[dim]hint:[/] {exc.hint}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except PublishRejected as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        err.print("[dim]hint:[/] nothing was written; fix the input and try again", highlight=False)
        raise typer.Exit(2) from None


@broker_app.command("start")
def broker_start(
    sasl_ssl_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Also listen with SASL_SSL on this port: generated CA, SASL users, ACLs "
            "(LEDGER_BROKER_SASL_SSL_PORT).",
        ),
    ] = None,
) -> None:
    """Start the local broker (downloads Kafka jars with mvn on first use)."""

    def body() -> None:
        settings = _settings()
        if sasl_ssl_port is not None:
            settings = settings.model_copy(update={"broker_sasl_ssl_port": sasl_ssl_port})
        broker = LocalBroker(settings)
        with err.status("starting Kafka (first run downloads jars with mvn)..."):
            report = broker.start()
        verb = "already running" if report.already_running else f"started in {report.seconds:.1f}s"
        fetched = " (jars downloaded)" if report.downloaded else ""
        out.print(
            f"Kafka {settings.kafka_version} {verb}{fetched}: pid {report.pid}, "
            f"bootstrap {settings.bootstrap_servers}"
        )
        out.print(f"  data: {report.layout.data}")
        out.print(f"  logs: {report.layout.server_log}")
        if settings.broker_sasl_ssl_port:
            security = report.layout.security
            out.print(
                f"  SASL_SSL: {settings.broker_host}:{settings.broker_sasl_ssl_port}, "
                f"CA {security.ca_file}, users and passwords in {security.users_file}"
            )

    guarded(body)


@broker_app.command("stop")
def broker_stop() -> None:
    """Stop the local broker gracefully (SIGTERM, wait)."""

    def body() -> None:
        pid, seconds, killed = LocalBroker(_settings()).stop()
        if pid is None:
            out.print("no local broker is running")
        elif killed:
            out.print(f"broker {pid} did not stop in time and was killed after {seconds:.1f}s")
        else:
            out.print(f"broker {pid} stopped cleanly in {seconds:.1f}s")

    guarded(body)


@broker_app.command("status")
def broker_status() -> None:
    """Is the local broker running and answering?"""

    def body() -> None:
        status = LocalBroker(_settings()).status()
        state = "running" if status.running else "not running"
        answer = "answers" if status.reachable else "does not answer"
        out.print(f"local broker: {state}" + (f" (pid {status.pid})" if status.pid else ""))
        out.print(f"{status.bootstrap_servers} {answer} metadata requests")
        out.print(f"data: {status.data_dir}\nlogs: {status.log_file}")
        if not status.reachable:
            raise typer.Exit(3)

    guarded(body)


@broker_app.command("logs")
def broker_logs(lines: Annotated[int, typer.Option("--lines", "-n")] = 50) -> None:
    """Print the last lines of the broker's server.log."""
    broker = LocalBroker(_settings())
    for line in broker.log_tail(lines):
        print(line)


@topics_app.command("create")
def topics_create() -> None:
    """Create ledger.runs, ledger.deliveries and ledger.deadletter (idempotent)."""

    def body() -> None:
        for result in asyncio.run(create_topics(_settings())):
            verb = "created" if result.created else "exists"
            out.print(f"{result.name}: {verb} ({result.partitions} partitions)")

    guarded(body)


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

    def body() -> None:
        settings = _settings()
        value = parse_payload(payload)
        specs = [DeliverySpec.parse(spec, value) for spec in delivery]

        async def go() -> list[Any]:
            async with Publisher(settings) as publisher:
                return await publisher.run_succeeded(run_id, result_hash, specs)

        requests = asyncio.run(_connected(go(), settings))
        out.print(f"run {run_id}: RunSucceeded + {len(requests)} DeliveryRequested committed")
        for request in requests:
            out.print(f"  {request.channel}:{request.recipient} key {request.idempotency_key}")

    guarded(body)


async def _connected(coro: Any, settings: Settings) -> Any:
    from aiokafka.errors import KafkaConnectionError

    try:
        return await coro
    except KafkaConnectionError:
        raise LedgerError(
            f"no Kafka broker answers at {settings.bootstrap_servers}",
            "start one with 'ledger broker start'",
        ) from None


@app.command("demo")
def demo(
    once: Annotated[bool, typer.Option("--once", help="Exit after the summary.")] = False,
    runs: Annotated[int, typer.Option(min=1, help="Runs to publish (3 deliveries each).")] = 40,
) -> None:
    """The whole product with faults: broker, 2 workers, projector, dashboard, fake provider."""
    from ledger.demo import DemoOptions, run_demo

    def body() -> None:
        summary = run_demo(_settings(), out, DemoOptions(runs=runs, once=once))
        if not summary.ok:
            raise LedgerError(
                "the demo ended with deliveries accepted twice or not settled",
                "see the summary above and the logs in the data dir's demo-logs/",
            )

    guarded(body)


register_all(app)


def main() -> None:
    """Console-script entry point."""
    # aiokafka logs every refused connection while we probe for a broker; the CLI
    # reports connection problems itself, in one line.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    app()
