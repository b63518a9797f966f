"""A local multi-node KRaft cluster: ``ledger broker start --nodes 3``.

Every node is broker and controller, with its own node id, port pair and directory
under ``<data dir>/kafka-cluster/node-N``; they vote in one static quorum and were
formatted with one cluster id. The nodes are started together: none answers before a
quorum of controllers runs.
"""

from __future__ import annotations

import base64
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from config.settings import Settings
from events.errors import LedgerError
from events.private_files import private_dir, private_file
from ledger.broker.config import ClusterNode, cluster_nodes, cluster_root
from ledger.broker.jars import ensure_jars
from ledger.broker.process import STOP_TIMEOUT_S, LocalBroker, StartReport
from ledger.errors import UsageError

CLUSTER_ID_FILE = "cluster.id"


@dataclass(frozen=True)
class ClusterStart:
    """What ``start`` did: each node's report, the whole wait, the clients' bootstrap."""

    nodes: list[StartReport]
    seconds: float
    bootstrap_servers: str


class LocalCluster:
    """``count`` local brokers in one KRaft quorum (``count`` odd: 3 tolerates one down)."""

    def __init__(self, settings: Settings, count: int) -> None:
        if count < 1 or count % 2 == 0:
            raise UsageError(
                f"a local cluster of {count} nodes has no majority to lose a node to",
                "use --nodes 3 (or 1, the single broker)",
            )
        if settings.kafka.broker_sasl_ssl_port:
            raise UsageError(
                "the local cluster has no SASL_SSL listener",
                "start it without --sasl-ssl-port, or use the single broker for SASL_SSL",
            )
        self.settings = settings
        self.nodes: list[ClusterNode] = cluster_nodes(settings, count)
        self.brokers = [LocalBroker(settings, node) for node in self.nodes]

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address (a client that finds one down tries the next)."""
        return ",".join(broker.plaintext for broker in self.brokers)

    def broker(self, node_id: int) -> LocalBroker:
        """The node ``node_id`` (1-based)."""
        if not 1 <= node_id <= len(self.brokers):
            raise UsageError(
                f"there is no node {node_id} in a cluster of {len(self.brokers)}",
                f"choose --node 1..{len(self.brokers)}",
            )
        return self.brokers[node_id - 1]

    def start(self) -> ClusterStart:
        """Start every node that is not running (all at once), return when each answers."""
        began = time.monotonic()
        self._share_cluster_id()
        launched: list[tuple[LocalBroker, int, bool]] = []
        reports: dict[int, StartReport] = {}
        idle = []
        for broker in self.brokers:
            running = broker.pid()
            if running is not None:
                reports[id(broker)] = StartReport(running, 0.0, False, True, broker.layout)
            else:
                idle.append(broker)
        if idle:  # fetched once, before the nodes look for them side by side
            ensure_jars(self.settings.cache_dir, self.settings.kafka.version)
        # Formatting is a JVM start of its own per node: the nodes launch side by side.
        with ThreadPoolExecutor(max_workers=len(self.brokers)) as pool:
            started = list(pool.map(LocalBroker.launch, idle))
        for broker, (pid, downloaded) in zip(idle, started, strict=True):
            launched.append((broker, pid, downloaded))
        for broker, pid, downloaded in launched:
            broker.wait_ready(pid)
            reports[id(broker)] = StartReport(
                pid, time.monotonic() - began, downloaded, False, broker.layout
            )
        return ClusterStart(
            [reports[id(b)] for b in self.brokers], time.monotonic() - began, self.bootstrap_servers
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> list[tuple[int, int | None, float, bool]]:
        """Stop every node (SIGTERM, wait up to ``timeout``, then SIGKILL): (node id, pid,
        seconds, had to kill) each."""
        # All at once: a node stopped after the others have gone has no quorum to
        # finish its controlled shutdown with, and waits out its whole timeout.
        with ThreadPoolExecutor(max_workers=len(self.brokers)) as pool:
            stopped = list(pool.map(lambda b: b.stop(timeout), self.brokers))
        return [(n.node_id, *s) for n, s in zip(self.nodes, stopped, strict=True)]

    def _share_cluster_id(self) -> None:
        """One cluster id, chosen once, in every node's cluster.id (each formats with it)."""
        shared = cluster_root(self.settings) / CLUSTER_ID_FILE
        if not shared.exists():
            private_dir(self.settings.data_dir)
            private_dir(shared.parent)
            private_file(shared).write_text(random_cluster_id() + "\n")
        cluster_id = shared.read_text().strip()
        for broker in self.brokers:
            private_dir(broker.layout.root)
            own = broker.layout.cluster_id_file
            if own.exists() and own.read_text().strip() != cluster_id:
                raise LedgerError(
                    f"node {broker.layout.root.name} belongs to another cluster "
                    f"({own.read_text().strip()}, not {cluster_id})",
                    f"move {cluster_root(self.settings)} away and start again",
                )
            private_file(own).write_text(cluster_id + "\n")


def running_cluster(settings: Settings) -> LocalCluster | None:
    """The local cluster whose node directories exist under the data dir (None: none)."""
    root = cluster_root(settings)
    count = len(list(root.glob("node-*"))) if root.exists() else 0
    return LocalCluster(settings, count) if count else None


def random_cluster_id() -> str:
    """A cluster id as ``kafka-storage random-uuid`` makes one (16 random bytes, base64url
    without padding, never starting with a dash), without starting a JVM for it."""
    for _ in range(100):
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
    raise LedgerError("no usable random cluster id in 100 tries", "this is a bug: report it")
