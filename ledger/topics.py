"""Create the ledger's topics (idempotent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from clients.kafka_security import client_options, connect_error
from config.parts import KafkaSettings
from config.settings import Settings
from events.errors import LedgerError

FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
# Workers' heartbeats: the latest per worker is all anyone reads, and their timestamps are
# the broker's own (one clock for every worker: streams/broker_clock.py).
HEARTBEATS = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(7 * 24 * 3600 * 1000),
    "message.timestamp.type": "LogAppendTime",
}

# The endpoint registry: one partition (one order for every reader), compacted by endpoint
# id (every event carries the whole endpoint, so the latest record per id is enough).
# The API keys alike, by key id.
ENDPOINTS = {"cleanup.policy": "compact", "retention.ms": "-1"}


@dataclass(frozen=True)
class Replication:
    """How many copies of each partition, and how many must have a write before
    ``acks=all`` returns (None: the broker's default)."""

    factor: int
    min_insync: int | None

    def configs(self) -> dict[str, str]:
        """The topic configs this adds (none for the broker's default)."""
        return {} if self.min_insync is None else {"min.insync.replicas": str(self.min_insync)}


def replication_for(settings: KafkaSettings, brokers: int) -> Replication:
    """The settings' replication, or where they leave it to the cluster (0): 3 copies
    and 2 in sync on three brokers or more (a write survives one broker lost, and one
    broker down does not stop writes), 1 copy on fewer."""
    factor = settings.replication_factor or (3 if brokers >= 3 else 1)
    if factor > brokers:
        raise LedgerError(
            f"replication factor {factor} needs {factor} brokers; the cluster has {brokers}",
            "set LEDGER_KAFKA__REPLICATION_FACTOR to at most the broker count (0: decide "
            "from the cluster)",
        )
    min_insync = settings.min_insync_replicas or (2 if factor >= 3 else None)
    if min_insync is not None and min_insync > factor:
        raise LedgerError(
            f"min.insync.replicas {min_insync} is more than the {factor} copies: "
            "no acks=all write could ever succeed",
            "set LEDGER_KAFKA__MIN_INSYNC_REPLICAS to at most LEDGER_KAFKA__REPLICATION_FACTOR",
        )
    return Replication(factor, min_insync)


async def cluster_replication(admin: AIOKafkaAdminClient, settings: KafkaSettings) -> Replication:
    """``replication_for`` the live cluster's broker count."""
    described = await admin.describe_cluster()
    return replication_for(settings, len(described["brokers"]))


async def resolved_replication(settings: KafkaSettings) -> Replication:
    """The replication topics get on the cluster ``settings`` point at (one admin
    connection; a ``LedgerError`` when no broker answers)."""
    admin = await _admin(settings)
    try:
        return await cluster_replication(admin, settings)
    finally:
        await admin.close()


async def _admin(settings: KafkaSettings) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        request_timeout_ms=15000,
        **client_options(settings),
    )
    try:
        await admin.start()
    except KafkaConnectionError:
        await admin.close()
        raise await connect_error(settings) from None
    return admin


@dataclass(frozen=True)
class TopicResult:
    """One topic and whether this call created it."""

    name: str
    partitions: int
    created: bool


async def create_topics(
    settings: Settings, names: tuple[str, ...] | None = None
) -> list[TopicResult]:
    """Create the ledger topics with ``settings.kafka.partitions``, infinite retention and
    the cluster's replication (``replication_for``)."""
    names = names or (
        *settings.kafka.topic_names(),
        settings.kafka.topic_heartbeats,
        settings.kafka.topic_endpoints,
        settings.kafka.topic_budgets,
        settings.kafka.topic_api_keys,
    )
    admin = await _admin(settings.kafka)
    try:
        existing = set(await admin.list_topics())
        replication = await cluster_replication(admin, settings.kafka)
        copies = replication.factor
        results: list[TopicResult] = []
        for name in names:
            if name in existing:
                results.append(TopicResult(name, await _partitions(admin, name), False))
                continue
            if name == settings.kafka.topic_heartbeats:
                configs, partitions = HEARTBEATS, 1
            elif name in (settings.kafka.topic_endpoints, settings.kafka.topic_api_keys):
                configs, partitions = ENDPOINTS, 1
            else:
                configs, partitions = FOREVER, settings.kafka.partitions
            topic = NewTopic(
                name, partitions, copies, topic_configs={**configs, **replication.configs()}
            )
            response = await admin.create_topics([topic])
            code, message = _topic_error(response, name)
            if code == TopicAlreadyExistsError.errno:
                results.append(TopicResult(name, await _partitions(admin, name), False))
            elif code != 0:
                raise LedgerError(
                    f"creating topic {name} failed: error {code} {message or ''}".strip(),
                    "check the broker log ('ledger broker logs')",
                )
            else:
                results.append(TopicResult(name, topic.num_partitions, True))
        return results
    finally:
        await admin.close()


def _topic_error(response: Any, name: str) -> tuple[int, str | None]:
    for entry in response.topic_errors:
        if entry[0] == name:
            return int(entry[1]), (entry[2] if len(entry) > 2 else None)
    return 0, None


async def _partitions(admin: AIOKafkaAdminClient, name: str) -> int:
    described = await admin.describe_topics([name])
    return len(described[0]["partitions"])
