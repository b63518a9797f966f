"""The broker's files: server.properties, the log4j2 config, and the data layout."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from config.settings import Settings
from events.private_files import private_dir, private_file
from ledger.broker.listeners import check_exposure, listeners_for
from ledger.broker.security import BrokerSecurity, listener_properties

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


def server_properties(settings: Settings, layout: BrokerLayout) -> str:
    """A single-node combined broker+controller on the configured ports; the listeners'
    hosts follow ledger/broker/listeners.py (unauthenticated ones on loopback only)."""
    check_exposure(settings)
    bound = listeners_for(settings)
    broker = f"{bound.plaintext_host}:{settings.kafka.broker_port}"
    controller = f"{bound.controller_host}:{settings.kafka.controller_port}"
    lines = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": controller,
        "listeners": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
        "advertised.listeners": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(layout.data),
        "num.partitions": str(settings.kafka.partitions),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
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


def write_config(settings: Settings, layout: BrokerLayout) -> None:
    """(Re)write the configuration files; the data dir is never touched here."""
    private_dir(layout.root.parent)  # the data directory
    for folder in (layout.root, layout.config, layout.logs, layout.data):
        private_dir(folder)
    if settings.kafka.broker_sasl_ssl_port:
        # It holds the PLAIN users' passwords then: owner only, before they are written.
        layout.server_properties.touch(mode=0o600)
        os.chmod(layout.server_properties, 0o600)
    for path, text in (
        (layout.server_properties, server_properties(settings, layout)),
        (layout.log4j2_properties, LOG4J2),
    ):
        private_file(path).write_text(text)
