"""Start, stop and inspect the local broker process."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError

from clients.kafka_security import client_options
from config.settings import Settings, changed
from events.errors import LedgerError
from events.private_files import UMASK, private_dir, private_file
from ledger.broker.config import BrokerLayout, ClusterNode, layout_for, write_config
from ledger.broker.jars import ensure_jars
from ledger.broker.listeners import LOOPBACK, check_exposure, listeners_for

# The JVM's heap, and its collector and compiler, as Kafka's own scripts split them
# (kafka-run-class.sh): KAFKA_HEAP_OPTS and KAFKA_JVM_PERFORMANCE_OPTS, when set in the
# environment, replace each part.
HEAP_OPTS = ("-Xms256m", "-Xmx512m")
PERFORMANCE_OPTS = ("-XX:+UseG1GC",)
# A node of a local cluster: three JVMs share a laptop's (or a CI runner's) memory and cores.
CLUSTER_HEAP_OPTS = ("-Xms128m", "-Xmx256m")
CLUSTER_PERFORMANCE_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def jvm_opts(*, cluster_node: bool) -> list[str]:
    """The broker JVM's options: ours, or what KAFKA_HEAP_OPTS / KAFKA_JVM_PERFORMANCE_OPTS
    say (scripts/test gives its short-lived brokers the quick compiler alone: its comment
    says what that saves)."""
    heap = os.environ.get("KAFKA_HEAP_OPTS")
    performance = os.environ.get("KAFKA_JVM_PERFORMANCE_OPTS")
    return [
        *(heap.split() if heap else CLUSTER_HEAP_OPTS if cluster_node else HEAP_OPTS),
        *(
            performance.split()
            if performance
            else CLUSTER_PERFORMANCE_OPTS
            if cluster_node
            else PERFORMANCE_OPTS
        ),
        "-Djava.awt.headless=true",
    ]


READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BrokerStatus:
    """What ``ledger broker status`` reports."""

    running: bool
    pid: int | None
    reachable: bool
    bootstrap_servers: str
    data_dir: Path
    log_file: Path


@dataclass(frozen=True)
class StartReport:
    """What happened on ``start``: how long it took and whether jars were downloaded."""

    pid: int
    seconds: float
    downloaded: bool
    already_running: bool
    layout: BrokerLayout


class LocalBroker:
    """One local KRaft broker under ``settings.data_dir``: the single node, or one
    ``node`` of a local cluster (ledger/broker/cluster.py)."""

    def __init__(self, settings: Settings, node: ClusterNode | None = None) -> None:
        self.settings = settings
        self.node = node
        self.layout = node.layout if node else layout_for(settings)
        # The listener every local broker has, whatever the clients are configured with:
        # start-up and readiness are checked there (on loopback when SASL_SSL is on).
        self.listeners = listeners_for(settings)
        port = node.broker_port if node else settings.kafka.broker_port
        self.plaintext = f"{self.listeners.plaintext_host}:{port}"

    # -- status -------------------------------------------------------------
    def pid(self) -> int | None:
        """The pid of our broker if it is alive, else None."""
        try:
            pid = int(self.layout.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) and _is_kafka(pid) else None

    def status(self) -> BrokerStatus:
        """Is our broker running, and does it answer a metadata request?"""
        # A cluster's node answers on its own address; the single node where clients look.
        address = self.plaintext if self.node else self.settings.kafka.bootstrap_servers
        return BrokerStatus(
            running=self.pid() is not None,
            pid=self.pid(),
            reachable=metadata_ok(
                address,
                timeout=3.0,
                options={} if self.node else client_options(self.settings.kafka),
            ),
            bootstrap_servers=address,
            data_dir=self.layout.data,
            log_file=self.layout.server_log,
        )

    # -- start --------------------------------------------------------------
    def start(self) -> StartReport:
        """Provision jars, format once, start the JVM, return when metadata answers."""
        began = time.monotonic()
        running = self.running()
        if running is not None:
            return StartReport(running, 0.0, False, True, self.layout)
        pid, downloaded = self.launch()
        self.wait_ready(pid)
        if self.settings.kafka.broker_sasl_ssl_port:
            asyncio.run(self._grant_local_roles())
        return StartReport(pid, time.monotonic() - began, downloaded, False, self.layout)

    def running(self) -> int | None:
        """The pid of our broker when it runs and answers; None when it does not run (a
        ``LedgerError`` when it runs but does not answer)."""
        check_exposure(self.settings)  # before anything: nothing is started or written
        running = self.pid()
        if running is None:
            return None
        if metadata_ok(self.plaintext, timeout=READY_TIMEOUT_S):
            return running
        raise LedgerError(
            f"broker process {running} is running but not answering at {self.plaintext}",
            f"see {self.layout.server_log}, or run 'ledger broker stop' then start again",
        )

    def launch(self) -> tuple[int, bool]:
        """Check the ports, provision jars, write the config, format once, start the JVM;
        (pid, whether jars were downloaded). It returns before the broker answers: a
        cluster's nodes answer only once a quorum of them runs."""
        java = shutil.which("java")
        if java is None:
            raise LedgerError(
                "Java is not installed (Kafka needs a Java 17+ runtime)",
                "install it (apt-get install openjdk-17-jre-headless), or use 'docker compose up'",
            )
        secure_port = self.settings.kafka.broker_sasl_ssl_port
        for host, port in self._ports():
            if _port_taken(host, port):
                raise LedgerError(
                    f"port {host}:{port} is already in use by another process",
                    "stop that process, or choose other ports with LEDGER_KAFKA__BROKER_PORT, "
                    "LEDGER_KAFKA__CONTROLLER_PORT (and LEDGER_KAFKA__BROKER_SASL_SSL_PORT)",
                )
        libs, downloaded = ensure_jars(self.settings.cache_dir, self.settings.kafka.version)
        if secure_port:
            self.layout.security.ensure(self.listeners.sasl_ssl_advertised or LOOPBACK)
        write_config(self.settings, self.layout, self.node)
        classpath = f"{libs}/*"
        self._format_once(java, classpath)
        return self._spawn(java, classpath), downloaded

    def _ports(self) -> list[tuple[str, int]]:
        if self.node is None:
            return self.listeners.ports(self.settings)
        return [
            (self.listeners.plaintext_host, self.node.broker_port),
            (self.listeners.controller_host, self.node.controller_port),
        ]

    async def _grant_local_roles(self) -> None:
        """Each local SASL user but admin gets its role's ACLs on the configured topics,
        granted over the plaintext listener (its principal is a super user)."""
        from ledger.acls import ROLES, grant, role_acls

        plain = changed(
            self.settings,
            {
                "kafka.bootstrap_servers": self.plaintext,
                "kafka.security_protocol": "PLAINTEXT",
                "kafka.sasl_username": None,
                "kafka.sasl_password": None,
                "kafka.ssl_cafile": None,
                "kafka.ssl_certfile": None,
                "kafka.ssl_keyfile": None,
                "kafka.ssl_key_password": None,
            },
        )
        acls = [acl for role in ROLES for acl in role_acls(plain, role, f"User:{role}")]
        await grant(plain, acls)

    def _format_once(self, java: str, classpath: str) -> None:
        meta = self.layout.data / "meta.properties"
        if meta.exists():
            if "cluster.id" not in meta.read_text(errors="replace"):
                raise LedgerError(
                    f"the Kafka data dir {self.layout.data} is corrupt (meta.properties has "
                    "no cluster.id)",
                    f"move it away (records in it are lost to this broker): "
                    f"mv {self.layout.data} {self.layout.data}.corrupt",
                )
            return
        if self.layout.data.exists() and any(self.layout.data.iterdir()):
            raise LedgerError(
                f"the Kafka data dir {self.layout.data} holds files but no meta.properties",
                f"move it away: mv {self.layout.data} {self.layout.data}.corrupt",
            )
        cluster_id = self._cluster_id(java, classpath)
        private_dir(self.layout.data)
        # SCRAM users live in the KRaft metadata: they are created here, at format time.
        scram = (
            self.layout.security.scram_format_args()
            if self.settings.kafka.broker_sasl_ssl_port
            else []
        )
        result = subprocess.run(
            [
                java,
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                # A cluster's quorum is static (controller.quorum.voters); one node is its own.
                *([] if self.node else ["--standalone"]),
                "-t",
                cluster_id,
                "-c",
                str(self.layout.server_properties),
                "--ignore-formatted",
                *scram,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            umask=UMASK,  # the metadata log it writes: owner only
        )
        if result.returncode != 0:
            why = _last_line(result.stderr or result.stdout)
            raise LedgerError(
                f"formatting the KRaft storage failed: {why}",
                f"remove {self.layout.data} if it is a leftover, then start again",
            )

    def _cluster_id(self, java: str, classpath: str) -> str:
        path = self.layout.cluster_id_file
        if path.exists():
            return path.read_text().strip()
        result = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        cluster_id = result.stdout.strip().splitlines()[-1]
        private_dir(path.parent)
        private_file(path).write_text(cluster_id + "\n")
        return cluster_id

    def _spawn(self, java: str, classpath: str) -> int:
        private_dir(self.layout.logs)
        command = [
            java,
            *jvm_opts(cluster_node=self.node is not None),
            f"-Dlog4j2.configurationFile={self.layout.log4j2_properties}",
            f"-Dkafka.logs.dir={self.layout.logs}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(self.layout.server_properties),
        ]
        with open(private_file(self.layout.stdout_log), "ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                umask=UMASK,  # log segments, checkpoints, server.log: owner only
            )
        private_file(self.layout.pid_file).write_text(f"{process.pid}\n")
        return process.pid

    def wait_ready(self, pid: int) -> None:
        """Return when the broker ``pid`` answers a metadata request (a ``LedgerError`` when
        it exits or does not answer in time)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not _alive(pid):
                self.layout.pid_file.unlink(missing_ok=True)
                raise LedgerError(
                    f"the broker exited during start-up: {self._last_error()}",
                    f"see {self.layout.server_log} and {self.layout.stdout_log}",
                )
            if metadata_ok(self.plaintext, timeout=2.0):
                return
            time.sleep(0.25)
        raise LedgerError(
            f"the broker did not answer within {READY_TIMEOUT_S:.0f}s",
            f"see {self.layout.server_log}; 'ledger broker stop' cleans up",
        )

    def _last_error(self) -> str:
        for path in (self.layout.stdout_log, self.layout.server_log):
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in reversed(lines[-200:]):
                if "ERROR" in line or "Exception" in line:
                    return line.strip()[:300]
        return "no error line in the logs"

    # -- stop ---------------------------------------------------------------
    def stop(self, timeout: float = STOP_TIMEOUT_S) -> tuple[int | None, float, bool]:
        """SIGTERM, wait for a clean shutdown; returns (pid, seconds, had_to_kill)."""
        pid = self.pid()
        if pid is None:
            self.layout.pid_file.unlink(missing_ok=True)
            return None, 0.0, False
        began = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        killed = False
        while _alive(pid):
            if time.monotonic() - began > timeout:
                os.kill(pid, signal.SIGKILL)
                killed = True
                _wait_gone(pid, 10.0)
                break
            time.sleep(0.1)
        self.layout.pid_file.unlink(missing_ok=True)
        return pid, time.monotonic() - began, killed

    def log_tail(self, lines: int = 50) -> list[str]:
        """The last lines of server.log."""
        try:
            return self.layout.server_log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []


def metadata_ok(
    bootstrap_servers: str, timeout: float = 3.0, options: Mapping[str, Any] | None = None
) -> bool:
    """True when a Kafka metadata request to ``bootstrap_servers`` succeeds; ``options``
    are the client's security options (clients/kafka_security.py; None: PLAINTEXT)."""
    return asyncio.run(_metadata_ok(bootstrap_servers, timeout, options or {}))


async def _metadata_ok(bootstrap_servers: str, wait_s: float, options: Mapping[str, Any]) -> bool:
    # Probing a broker that is not up yet is expected to fail: keep aiokafka quiet.
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return await _probe(bootstrap_servers, wait_s, options)
    finally:
        quiet.setLevel(level)


async def _probe(bootstrap_servers: str, wait_s: float, options: Mapping[str, Any]) -> bool:
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap_servers,
        request_timeout_ms=int(wait_s * 1000) + 1000,
        **options,
    )
    try:
        await asyncio.wait_for(client.bootstrap(), wait_s)
        return True
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await client.close()


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _is_kafka(pid: int) -> bool:
    # A stale pid file may name a pid the OS has since reused for something else.
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"
