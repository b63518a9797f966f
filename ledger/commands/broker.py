"""``ledger broker start|stop|status|logs``: the local Kafka broker, or a local cluster of
three (``--nodes 3``; ledger/broker/); ``ledger broker certs``: TLS files for a broker run
elsewhere (docker-compose.yml)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger.broker import LocalBroker
from ledger.broker.cluster import LocalCluster, running_cluster
from ledger.broker.security import BrokerSecurity

out = Console()
err = Console(stderr=True)
app = typer.Typer(
    no_args_is_help=True, help="The local Kafka broker (or a local cluster: --nodes 3)."
)

NodeOption = Annotated[
    int | None,
    typer.Option("--node", min=1, help="One node of the local cluster (1, 2, 3)."),
]


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
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            min=1,
            max=9,
            help="Brokers in a local KRaft cluster (3: replication factor 3, min ISR 2); "
            "node N listens on the broker and controller ports + 2(N-1).",
        ),
    ] = 1,
) -> None:
    """Start the local broker (downloads Kafka jars with mvn on first use)."""
    settings = Settings()
    if sasl_ssl_port is not None:
        settings = changed(settings, {"kafka.broker_sasl_ssl_port": sasl_ssl_port})
    if nodes > 1:
        _start_cluster(settings, nodes)
        return
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


def _start_cluster(settings: Settings, nodes: int) -> None:
    cluster = LocalCluster(settings, nodes)
    with err.status(f"starting a {nodes}-node Kafka cluster..."):
        report = cluster.start()
    out.print(
        f"Kafka {settings.kafka.version}: {nodes}-node cluster up in {report.seconds:.1f}s, "
        f"bootstrap {report.bootstrap_servers}"
    )
    for node, started in zip(cluster.nodes, report.nodes, strict=True):
        verb = "already running" if started.already_running else "started"
        out.print(
            f"  node {node.node_id}: pid {started.pid} {verb}, broker :{node.broker_port}, "
            f"controller :{node.controller_port}, data {started.layout.data}"
        )
    out.print(
        "  topics the ledger creates here get replication factor 3 and min.insync.replicas 2;"
        f"\n  clients: export LEDGER_KAFKA__BOOTSTRAP_SERVERS={report.bootstrap_servers}",
        highlight=False,
        soft_wrap=True,
    )


def _stopped(what: str, pid: int | None, seconds: float, killed: bool) -> None:
    if pid is None:
        out.print(f"no {what} is running")
    elif killed:
        out.print(f"{what} {pid} did not stop in time and was killed after {seconds:.1f}s")
    else:
        out.print(f"{what} {pid} stopped cleanly in {seconds:.1f}s")


def _brokers(settings: Settings, node: int | None) -> list[tuple[str, LocalBroker]]:
    """The brokers a command is about: the one ``node`` of the local cluster, or the
    single broker and, when there is a local cluster, its nodes instead when the single
    broker is not running."""
    cluster = running_cluster(settings)
    if node is not None:
        if cluster is None:
            raise LedgerError(
                "there is no local cluster under this data dir",
                "start one with 'ledger broker start --nodes 3'",
            )
        return [(f"node {node}", cluster.broker(node))]
    single = [("local broker", LocalBroker(settings))]
    if cluster is None or single[0][1].pid() is not None:
        return single
    return [(f"node {b.node.node_id}", b) for b in cluster.brokers if b.node]


@app.command("stop")
def broker_stop(node: NodeOption = None) -> None:
    """Stop the local broker and every node of a local cluster (or one node: --node),
    gracefully (SIGTERM, wait)."""
    settings = Settings()
    if node is not None:
        name, broker = _brokers(settings, node)[0]
        _stopped(name, *broker.stop())
        return
    cluster = running_cluster(settings)
    single = LocalBroker(settings)
    if cluster is None or single.pid() is not None:
        pid, seconds, killed = single.stop()
        _stopped("local broker", pid, seconds, killed)
    if cluster is not None:
        for number, pid, seconds, killed in cluster.stop():
            _stopped(f"node {number}", pid, seconds, killed)


@app.command("status")
def broker_status(node: NodeOption = None) -> None:
    """Is the local broker (each node of a local cluster) running and answering?"""
    unreachable = False
    for name, broker in _brokers(Settings(), node):
        status = broker.status()
        state = "running" if status.running else "not running"
        answer = "answers" if status.reachable else "does not answer"
        out.print(f"{name}: {state}" + (f" (pid {status.pid})" if status.pid else ""))
        out.print(f"{status.bootstrap_servers} {answer} metadata requests")
        out.print(f"data: {status.data_dir}\nlogs: {status.log_file}")
        unreachable = unreachable or not status.reachable
    if unreachable:
        raise typer.Exit(3)


@app.command("logs")
def broker_logs(
    lines: Annotated[int, typer.Option("--lines", "-n", min=1)] = 50, node: NodeOption = None
) -> None:
    """Print the last lines of the broker's server.log (a cluster node's: --node)."""
    settings = Settings()
    broker = _brokers(settings, node)[0][1] if node is not None else LocalBroker(settings)
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
