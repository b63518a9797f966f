"""Create the ledger's topics (idempotent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from clients.kafka_security import client_options, connect_error
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
class TopicResult:
    """One topic and whether this call created it."""

    name: str
    partitions: int
    created: bool


async def create_topics(
    settings: Settings, names: tuple[str, ...] | None = None
) -> list[TopicResult]:
    """Create the ledger topics with ``settings.kafka.partitions`` and infinite retention."""
    names = names or (
        *settings.kafka.topic_names(),
        settings.kafka.topic_heartbeats,
        settings.kafka.topic_endpoints,
        settings.kafka.topic_budgets,
        settings.kafka.topic_api_keys,
    )
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        request_timeout_ms=15000,
        **client_options(settings.kafka),
    )
    try:
        await admin.start()
    except KafkaConnectionError:
        await admin.close()
        raise await connect_error(settings.kafka) from None
    try:
        existing = set(await admin.list_topics())
        results: list[TopicResult] = []
        for name in names:
            if name in existing:
                results.append(TopicResult(name, await _partitions(admin, name), False))
                continue
            if name == settings.kafka.topic_heartbeats:
                topic = NewTopic(name, 1, 1, topic_configs=dict(HEARTBEATS))
            elif name in (settings.kafka.topic_endpoints, settings.kafka.topic_api_keys):
                topic = NewTopic(name, 1, 1, topic_configs=dict(ENDPOINTS))
            else:
                topic = NewTopic(name, settings.kafka.partitions, 1, topic_configs=dict(FOREVER))
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
