"""The local cluster's configuration, without starting it: each node's server.properties,
one quorum, the internal topics replicated, and the refusals (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import Settings, changed
from events.errors import LedgerError
from ledger.broker.cluster import LocalCluster, random_cluster_id
from ledger.broker.config import cluster_nodes, server_properties
from ledger.broker.process import jvm_opts
from ledger.errors import UsageError
from ledger.topics import Replication, replication_for


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_three_nodes_have_their_own_ids_ports_and_directories_and_one_quorum(
    tmp_path: Path,
) -> None:
    settings = Settings(kafka={"broker_port": 9092, "controller_port": 9093}, data_dir=tmp_path)
    nodes = cluster_nodes(settings, 3)
    written = [_properties(server_properties(settings, n.layout, n)) for n in nodes]
    assert [p["node.id"] for p in written] == ["1", "2", "3"]
    assert [p["listeners"] for p in written] == [
        f"PLAINTEXT://127.0.0.1:{b},CONTROLLER://127.0.0.1:{b + 1}" for b in (9092, 9094, 9096)
    ]
    assert len({p["log.dirs"] for p in written}) == 3
    voters = "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097"
    assert all(p["controller.quorum.voters"] == voters for p in written)
    for p in written:
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["transaction.state.log.min.isr"] == "2"
    single = _properties(server_properties(settings, nodes[0].layout))
    assert single["offsets.topic.replication.factor"] == "1"
    assert "controller.quorum.voters" not in single


def test_replication_follows_the_broker_count_unless_set() -> None:
    kafka = Settings().kafka
    assert (replication_for(kafka, 1).factor, replication_for(kafka, 1).configs()) == (1, {})
    three = replication_for(kafka, 3)
    assert (three.factor, three.configs()) == (3, {"min.insync.replicas": "2"})
    two = changed(Settings(), {"kafka.replication_factor": 2, "kafka.min_insync_replicas": 2})
    assert replication_for(two.kafka, 5) == Replication(2, 2)
    with pytest.raises(LedgerError, match="needs 2 brokers"):
        replication_for(two.kafka, 1)


def test_refusals_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no majority"):
        LocalCluster(Settings(data_dir=tmp_path), 2)
    crowded = Settings(kafka={"broker_port": 9092, "controller_port": 9094}, data_dir=tmp_path)
    with pytest.raises(UsageError, match="collide"):
        cluster_nodes(crowded, 3)
    with pytest.raises(UsageError, match="no node 4"):
        LocalCluster(Settings(data_dir=tmp_path), 3).broker(4)


def test_a_cluster_id_is_kafkas_shape() -> None:
    ids = {random_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_the_broker_jvm_takes_kafkas_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_HEAP_OPTS", raising=False)
    monkeypatch.delenv("KAFKA_JVM_PERFORMANCE_OPTS", raising=False)
    assert jvm_opts(cluster_node=False) == [
        "-Xms256m",
        "-Xmx512m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
    ]
    monkeypatch.setenv("KAFKA_JVM_PERFORMANCE_OPTS", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
    monkeypatch.setenv("KAFKA_HEAP_OPTS", "-Xmx1g")
    for node in (False, True):
        assert jvm_opts(cluster_node=node) == [
            "-Xmx1g",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
        ]
