"""Every producer of the project is idempotent with acks=all (issue 30, item 3): a send
retried after a partition leader fails over is written once, and a write is taken only
once every in-sync replica (at least min.insync.replicas of them) has it.

Asked of the real client objects each component builds and starts against the broker,
and of the aiokafka producer the worker's faust app builds."""

from __future__ import annotations

from pathlib import Path

from aiokafka import AIOKafkaProducer

from clients import Publisher
from clients.aiokafka_internals import delivery_guarantees
from clients.signed_log import SignedLog
from config.settings import Settings
from projections.deadletters import ProjectorDeadLetters
from streams.app import create_app
from streams.broker_clock import BrokerClock
from streams.faust_internals import aiokafka_producer_of
from streams.heartbeat import Heartbeat
from streams.outcome_producer import OutcomeProducer

ALL = -1  # aiokafka's acks for "all in-sync replicas"


def durable(producer: AIOKafkaProducer | None) -> tuple[bool, int]:
    assert producer is not None
    return delivery_guarantees(producer)


async def test_every_producer_is_idempotent_with_acks_all(
    settings: Settings, tmp_path: Path
) -> None:
    async with Publisher(settings, producer_name="durable") as publisher:
        assert durable(publisher._producer) == (True, ALL), "the agents' publisher"
    log: SignedLog[bytes] = SignedLog(
        settings, settings.kafka.topic_endpoints, None, lambda e: e, lambda e: e
    )
    async with log:
        assert durable(log._producer) == (True, ALL), "operator, budget and endpoint logs"
    outcomes = OutcomeProducer(settings)
    try:
        assert durable(await outcomes._started()) == (True, ALL), "the worker's outcomes"
    finally:
        await outcomes.stop()
    heartbeat = Heartbeat(settings.kafka, settings.worker, "durable", BrokerClock(1.0, 10.0))
    try:
        assert durable(await heartbeat._started()) == (True, ALL), "the worker's heartbeats"
    finally:
        await heartbeat.stop()
    async with ProjectorDeadLetters(settings.kafka) as letters:
        await letters._send([])
        assert durable(letters._producer) == (True, ALL), "the projector's dead letters"
    worker = create_app(settings, "durable")
    faust_producer = aiokafka_producer_of(worker.app)
    try:
        assert durable(faust_producer) == (True, ALL), "the worker's faust app (claims, changelog)"
    finally:
        await faust_producer.stop()
