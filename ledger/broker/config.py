"""The broker's files: server.properties, the log4j2 config, and the data layout."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from config.settings import Settings
from events.private_files import private_dir, private_file
from ledger.broker.listeners import check_exposure, listeners_for
from ledger.broker.security import BrokerSecurity, listener_properties
from ledger.errors import UsageError

LOG4J2 = """status = error
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass(frozen=True)
class BrokerLayout:
    """Paths of one local broker: its KRaft data, its logs, its pid and cluster id."""

    root: Path

    @property
    def data(self) -> Path:
        """KRaft metadata and topic partitions."""
        return self.root / "data"

    @property
    def logs(self) -> Path:
        """server.log and the JVM's stdout."""
        return self.root / "logs"

    @property
    def config(self) -> Path:
        """server.properties and log4j2.properties."""
        return self.root / "config"

    @property
    def security(self) -> BrokerSecurity:
        """The SASL_SSL listener's CA, certificate and users (when it is enabled)."""
        return BrokerSecurity(self.root / "security")

    @property
    def pid_file(self) -> Path:
        """The running broker's process id."""
        return self.root / "broker.pid"

    @property
    def cluster_id_file(self) -> Path:
        """The cluster id chosen when the data dir was formatted."""
        return self.root / "cluster.id"

    @property
    def server_properties(self) -> Path:
        """The broker configuration file."""
        return self.config / "server.properties"

    @property
    def log4j2_properties(self) -> Path:
        """The logging configuration file."""
        return self.config / "log4j2.properties"

    @property
    def server_log(self) -> Path:
        """The broker's main log."""
        return self.logs / "server.log"

    @property
    def stdout_log(self) -> Path:
        """What the JVM printed (crashes before logging starts end up here)."""
        return self.logs / "stdout.log"


def layout_for(settings: Settings) -> BrokerLayout:
    """The broker layout under the configured data dir."""
    return BrokerLayout(settings.data_dir / "kafka")


@dataclass(frozen=True)
class ClusterNode:
    """One node of a local multi-node cluster: its id, its two ports, its own directory,
    and the controller quorum it votes in (every node is broker and controller)."""

    node_id: int
    broker_port: int
    controller_port: int
    layout: BrokerLayout
    voters: str  # controller.quorum.voters: "1@host:port,2@host:port,..."
    nodes: int


def cluster_root(settings: Settings) -> Path:
    """Where a local multi-node cluster keeps its nodes (node-1, node-2, ...)."""
    return settings.data_dir / "kafka-cluster"


def cluster_nodes(settings: Settings, count: int) -> list[ClusterNode]:
    """``count`` nodes on consecutive port pairs from the configured ones: node N listens
    on broker_port + 2(N-1) and controller_port + 2(N-1) (9092/9093, 9094/9095, ...)."""
    host = listeners_for(settings).controller_host
    ports = [
        (settings.kafka.broker_port + 2 * n, settings.kafka.controller_port + 2 * n)
        for n in range(count)
    ]
    flat = [port for pair in ports for port in pair]
    if len(set(flat)) != len(flat) or max(flat) > 65535:
        raise UsageError(
            f"the {count} nodes' ports collide or run past 65535 "
            f"(broker {settings.kafka.broker_port}, controller {settings.kafka.controller_port})",
            "use a controller port one above the broker port "
            "(LEDGER_KAFKA__BROKER_PORT=9092 LEDGER_KAFKA__CONTROLLER_PORT=9093)",
        )
    voters = ",".join(f"{n + 1}@{host}:{c}" for n, (_, c) in enumerate(ports))
    root = cluster_root(settings)
    return [
        ClusterNode(n + 1, b, c, BrokerLayout(root / f"node-{n + 1}"), voters, count)
        for n, (b, c) in enumerate(ports)
    ]


def cluster_bootstrap(settings: Settings, count: int) -> str:
    """The bootstrap servers of a ``count``-node local cluster: every node."""
    host = listeners_for(settings).plaintext_host
    return ",".join(f"{host}:{n.broker_port}" for n in cluster_nodes(settings, count))


def replicated(nodes: int) -> dict[str, str]:
    """The internal topics' replication: 3 copies and 2 in sync wherever there are 3
    nodes, so a committed offset or transaction outlives one broker; 1 on one node."""
    factor = str(min(nodes, 3))
    min_isr = "2" if nodes >= 3 else "1"
    return {
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": factor,
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": factor,
    }


def server_properties(
    settings: Settings, layout: BrokerLayout, node: ClusterNode | None = None
) -> str:
    """A combined broker+controller on the configured ports: the single node (its own
    quorum), or one ``node`` of a local cluster (a static quorum of every node); the
    listeners' hosts follow ledger/broker/listeners.py (unauthenticated ones on loopback
    only)."""
    check_exposure(settings)
    bound = listeners_for(settings)
    broker_port = node.broker_port if node else settings.kafka.broker_port
    controller_port = node.controller_port if node else settings.kafka.controller_port
    broker = f"{bound.plaintext_host}:{broker_port}"
    controller = f"{bound.controller_host}:{controller_port}"
    quorum = (
        {"controller.quorum.voters": node.voters}
        if node
        else {"controller.quorum.bootstrap.servers": controller}
    )
    lines = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id if node else 1),
        **quorum,
        "listeners": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
        "advertised.listeners": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(layout.data),
        "num.partitions": str(settings.kafka.partitions),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.num.partitions": "8",
        **replicated(node.nodes if node else 1),
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.flush.interval.messages": "9223372036854775807",
    }
    if bound.sasl_ssl_host is not None:
        port = settings.kafka.broker_sasl_ssl_port
        lines["listeners"] += f",SASL_SSL://{bound.sasl_ssl_host}:{port}"
        lines["advertised.listeners"] += f",SASL_SSL://{bound.sasl_ssl_advertised}:{port}"
        lines["listener.security.protocol.map"] += ",SASL_SSL:SASL_SSL"
        lines.update(listener_properties(layout.security))
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def write_config(settings: Settings, layout: BrokerLayout, node: ClusterNode | None = None) -> None:
    """(Re)write the configuration files; the data dir is never touched here."""
    private_dir(layout.root.parent)  # the data directory
    for folder in (layout.root, layout.config, layout.logs, layout.data):
        private_dir(folder)
    if settings.kafka.broker_sasl_ssl_port:
        # It holds the PLAIN users' passwords then: owner only, before they are written.
        layout.server_properties.touch(mode=0o600)
        os.chmod(layout.server_properties, 0o600)
    for path, text in (
        (layout.server_properties, server_properties(settings, layout, node)),
        (layout.log4j2_properties, LOG4J2),
    ):
        private_file(path).write_text(text)
