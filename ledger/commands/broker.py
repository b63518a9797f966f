"""``ledger broker start|stop|status|logs``: the local single-node Kafka broker (ledger/broker/);
``ledger broker certs``: TLS files for a broker run elsewhere (docker-compose.yml)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger.broker import LocalBroker
from ledger.broker.security import BrokerSecurity

out = Console()
err = Console(stderr=True)
app = typer.Typer(no_args_is_help=True, help="The local single-node Kafka broker.")


@app.command("start")
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
    settings = Settings()
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


@app.command("stop")
def broker_stop() -> None:
    """Stop the local broker gracefully (SIGTERM, wait)."""
    pid, seconds, killed = LocalBroker(Settings()).stop()
    if pid is None:
        out.print("no local broker is running")
    elif killed:
        out.print(f"broker {pid} did not stop in time and was killed after {seconds:.1f}s")
    else:
        out.print(f"broker {pid} stopped cleanly in {seconds:.1f}s")


@app.command("status")
def broker_status() -> None:
    """Is the local broker running and answering?"""
    status = LocalBroker(Settings()).status()
    state = "running" if status.running else "not running"
    answer = "answers" if status.reachable else "does not answer"
    out.print(f"local broker: {state}" + (f" (pid {status.pid})" if status.pid else ""))
    out.print(f"{status.bootstrap_servers} {answer} metadata requests")
    out.print(f"data: {status.data_dir}\nlogs: {status.log_file}")
    if not status.reachable:
        raise typer.Exit(3)


@app.command("logs")
def broker_logs(lines: Annotated[int, typer.Option("--lines", "-n", min=1)] = 50) -> None:
    """Print the last lines of the broker's server.log."""
    broker = LocalBroker(Settings())
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


@app.command("certs")
def broker_certs(
    directory: Annotated[
        Path,
        typer.Argument(file_okay=False, help="Where ca.pem and broker-keystore.pem go."),
    ],
    host: Annotated[
        str, typer.Option(help="The broker's name in its certificate (also 127.0.0.1, localhost).")
    ] = "localhost",
) -> None:
    """Make a CA and a broker certificate for a broker run elsewhere (docker-compose.yml's
    certs step); files already there are kept. The directory is 0700, the keystore 0600."""
    security = BrokerSecurity(directory)
    security.ensure_tls(host)
    out.print(f"CA {security.ca_file}; broker keystore {security.keystore}", highlight=False)
