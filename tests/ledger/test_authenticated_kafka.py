"""Every Kafka client over the SASL_SSL listener of a real broker, refusals in one line,
and the ACLs per role. The suite's fixtures (``settings``, workers, readers) run here as
the ``admin`` user over SASL_SSL: ``broker`` is overridden for this module."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from events import DeliverySpec, Publisher
from events.errors import LedgerError
from events.kafka_security import client_options
from events.settings import Settings
from ledger.acls import grant, role_acls
from ledger.stack import settings_env
from tests.fixtures.secure_broker import SecureBroker


@pytest.fixture(scope="module")
def broker(secure_broker: SecureBroker) -> Settings:
    """The suite's fixtures, as the super user ``admin`` over SASL_SSL."""
    return secure_broker.as_user("admin")


def as_user(settings: Settings, secure: SecureBroker, name: str, **update: object) -> Settings:
    """``settings`` (this test's topics) as another SASL user."""
    return secure.as_user(
        name,
        **{
            "topic_runs": settings.topic_runs,
            "topic_deliveries": settings.topic_deliveries,
            "topic_deadletter": settings.topic_deadletter,
            "partitions": settings.partitions,
            "data_dir": settings.data_dir,
            **update,
        },
    )


def ledger(settings: Settings, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def test_a_principal_without_write_on_deliveries_cannot_append_to_it(
    settings: Settings, secure_broker: SecureBroker
) -> None:
    await grant(settings, role_acls(settings, "reader", "User:reader"))
    await grant(settings, role_acls(settings, "agent", "User:agent"))
    reader = as_user(settings, secure_broker, "reader")
    producer = AIOKafkaProducer(
        bootstrap_servers=reader.bootstrap_servers, **client_options(reader)
    )
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(settings.topic_deliveries, b"forged outcome", key=b"k")
    finally:
        await producer.stop()

    # The agent role may write requests there (and, per topic, nothing finer: README).
    agent = as_user(settings, secure_broker, "agent")
    async with Publisher(agent, transactional_id="ledger-publisher-acl-test") as publisher:
        await publisher.run_started("run-acl")
    # ... but only under its transactional-id prefix.
    with pytest.raises(LedgerError, match=r"does not allow user 'agent'.*someone-else"):
        async with Publisher(agent, transactional_id="someone-else") as publisher:
            await publisher.run_started("run-acl-2")
