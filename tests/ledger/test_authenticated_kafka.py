"""Every Kafka client over the SASL_SSL listener of a real broker, refusals in one line,
and the ACLs per role. The suite's fixtures (``settings``, workers, readers) run here as
the ``admin`` user over SASL_SSL: ``broker`` is overridden for this module."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from pydantic import SecretStr

from clients import DeliverySpec, Publisher
from clients.endpoint_registry import append_endpoint_event, read_events
from clients.kafka_security import client_options
from clients.operator_actions import OperatorLog
from config.settings import Settings, changed
from events.delivery_state import Status
from events.endpoints import EndpointSpec, open_circuit, register
from events.errors import LedgerError
from events.keys import idempotency_key
from events.operator import DeliveryRedriveRequested
from events.ports import free_port
from ledger.acls import ROLES, grant, role_acls
from ledger.broker import LocalBroker
from ledger.simulator.background import BackgroundSimulator
from ledger.stack import settings_env
from streams.continuity import ContinuityGuard
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.secure_broker import SecureBroker
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for

# One process runs them all: the secure broker is a session fixture, and each pytest
# process that ran one of these tests started (and paid for) a SASL_SSL broker of its own.
pytestmark = pytest.mark.xdist_group("secure_broker")


@pytest.fixture(scope="module")
def broker(secure_broker: SecureBroker) -> Settings:
    """The suite's fixtures, as the super user ``admin`` over SASL_SSL."""
    return secure_broker.as_user("admin")


def as_user(
    settings: Settings, secure: SecureBroker, name: str, mechanism: str = "SCRAM-SHA-512"
) -> Settings:
    """``settings`` (this test's topics, group, endpoints) as another SASL user."""
    return changed(
        settings,
        {
            "kafka.sasl_username": name,
            "kafka.sasl_password": SecretStr(secure.users[name]),
            "kafka.sasl_mechanism": mechanism,
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
    granted = ledger(settings, "acls", "grant", "reader", "reader")  # as admin
    assert granted.returncode == 0, granted.stderr
    assert "12 ACLs granted to reader (reader)" in granted.stdout
    await grant(settings, role_acls(settings, "agent", "User:agent"))
    reader = as_user(settings, secure_broker, "reader")
    producer = AIOKafkaProducer(
        bootstrap_servers=reader.kafka.bootstrap_servers, **client_options(reader.kafka)
    )
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(
                settings.kafka.topic_deliveries, b"forged outcome", key=b"k"
            )
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


async def test_the_worker_role_appends_its_circuit_transitions_to_the_registry(
    settings: Settings, secure_broker: SecureBroker
) -> None:
    """A worker's breaker writes ``circuit_opened``/``closed`` to ``ledger.endpoints`` with
    the worker's own credentials (streams/app.py): its role must allow it, or no circuit
    ever opens on an authenticated cluster. A reader may not."""
    await grant(settings, role_acls(settings, "worker", "User:worker"))
    await grant(settings, role_acls(settings, "reader", "User:reader"))
    now = datetime.now(UTC)
    registered = register(
        "hooks",
        EndpointSpec(channel="webhook", address="https://hooks.test/"),
        (),
        actor="alice",
        producer="ledger-endpoints",
        at=now,
        existing=None,
    )
    await append_endpoint_event(settings.kafka, registered)  # as admin
    opened = open_circuit(
        registered.endpoint, failures=5, sends=5, reason="5 of 5 failed", producer="w", at=now
    )
    worker = as_user(settings, secure_broker, "worker", mechanism="SCRAM-SHA-256")
    await append_endpoint_event(worker.kafka, opened)
    assert await read_events(settings.kafka) == [registered, opened]
    reader = as_user(settings, secure_broker, "reader")
    with pytest.raises(LedgerError, match="does not allow user 'reader'"):
        await append_endpoint_event(reader.kafka, opened)


async def test_the_operator_role_appends_operator_events_and_nothing_else(
    settings: Settings, secure_broker: SecureBroker, read_topic: ReadTopic
) -> None:
    await grant(settings, role_acls(settings, "operator", "User:operator"))
    operator = as_user(settings, secure_broker, "operator")
    redrive = DeliveryRedriveRequested(
        idempotency_key=idempotency_key("run-acl-op", "agent.result", "webhook", "https://x.test/"),
        run_id="run-acl-op",
        producer="ledger-operator",
        operator="alice",
        reason="endpoint fixed",
        scope="key",
        fencing_token=1,
        seen_status="FAILED",
    )
    async with OperatorLog(operator) as log:
        await log.append([redrive])
    [appended] = await read_topic(settings.kafka.topic_deliveries)
    assert appended == redrive
    # Its events go to ledger.deliveries only: it may not write runs, nor read anything.
    producer = AIOKafkaProducer(
        bootstrap_servers=operator.kafka.bootstrap_servers, **client_options(operator.kafka)
    )
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(settings.kafka.topic_runs, b"a run", key=b"k")
    finally:
        await producer.stop()


async def test_every_client_works_over_sasl_ssl_each_as_its_role(
    settings: Settings,
    secure_broker: SecureBroker,
    worker_factory: WorkerFactory,
    receiver: BackgroundSimulator,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
    tmp_path: Path,
) -> None:
    made = ledger(settings, "topics", "create")  # as admin; the fixture made them already
    assert made.returncode == 0, made.stderr
    # the three, the heartbeats, the endpoint registry, the budgets and the API keys
    assert made.stdout.count("exists") == 7, made.stdout
    base = receiver.settings(worker_factory.settings)
    for role in ROLES:
        await grant(settings, role_acls(base, role, f"User:{role}"))
    worker = as_user(base, secure_broker, "worker", mechanism="SCRAM-SHA-256")
    agent = as_user(base, secure_broker, "agent")
    reader = as_user(base, secure_broker, "reader", mechanism="PLAIN")

    async with Publisher(agent, producer_name="sasl-agent") as publisher:
        requests = await publisher.run_succeeded(
            "run-sasl",
            "sha256:r",
            [DeliverySpec(channel="webhook", recipient=receiver.webhook_url("ops"), payload={})],
        )
    key = requests[0].idempotency_key
    worker_factory.settings = worker
    process = worker_factory.start("w-sasl")

    async def confirmed() -> bool:
        assert process.alive(), process.output()[-3000:]
        state = (await ledger_view()).get(key)
        return state is not None and state.status is Status.CONFIRMED

    await wait_for(confirmed, 90, "the delivery CONFIRMED by a worker over SASL_SSL")
    assert receiver.accepted(key) == 1
    assert "AuthorizationFailed" not in process.output()
    # No password in the worker's or the broker's log.
    server_log = LocalBroker(secure_broker.plain).layout.server_log.read_text(errors="replace")
    for password in secure_broker.users.values():
        assert password not in process.output()
        assert password not in server_log

    # The continuity guard reads the worker group's offsets as the worker (Describe on
    # its group); a reader principal is refused that.
    for who, allowed in ((worker, True), (reader, False)):
        guard = ContinuityGuard(who, who.kafka.topic_deliveries, who.worker.group)
        try:
            if allowed:
                await guard.on_assigned(range(who.kafka.partitions))
            else:
                with pytest.raises(Exception, match="GroupAuthorizationFailed"):
                    await guard.on_assigned(range(who.kafka.partitions))
        finally:
            await guard.stop()

    # Projector and verify, as the read-only principal.
    live_projection.settings = reader
    live_projection.start()
    await live_projection.matches(await ledger_view())

    replayed = ledger(reader, "replay", "--key", key, "--format", "jsonl")
    assert replayed.returncode == 0, replayed.stderr
    assert "delivery.confirmed" in replayed.stdout, replayed.stdout
    status = ledger(reader, "status", "--json", "--dsn", live_projection.dsn)
    assert status.returncode == 0, status.stderr
    probed = ledger(reader, "broker", "status")
    assert f"{secure_broker.sasl_ssl} answers metadata requests" in probed.stdout, probed.stdout

    # The dashboard's /metrics reads the log's ends over SASL_SSL too.
    port = free_port()
    dashboard = subprocess.Popen(
        [sys.executable, "-m", "ledger", "dashboard", "--dsn", live_projection.dsn,
         "--port", str(port)],
        env=settings_env(reader),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        metrics = ""
        for _ in range(60):
            try:
                metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                break
            except httpx.TransportError:
                time.sleep(0.5)
        assert "ledger_log_up 1.0" in metrics, metrics[:2000]
        run = httpx.get(f"http://127.0.0.1:{port}/api/runs/run-sasl", timeout=5)
        assert run.status_code == 200, run.text
        assert key in run.text
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)


@pytest.mark.parametrize(
    ("client", "said"),
    [
        ("no credentials", "closed the connection (SSL)"),
        ("wrong password", "refused the credentials of SASL user 'agent' (SCRAM-SHA-512)"),
        ("plaintext", "no Kafka broker answers at"),
    ],
)
async def test_a_client_without_valid_credentials_is_refused_in_one_line(
    settings: Settings, secure_broker: SecureBroker, client: str, said: str
) -> None:
    wrong = "wrong-password-0123456789"
    updates: dict[str, dict[str, object]] = {
        "no credentials": {"kafka.security_protocol": "SSL", "kafka.sasl_username": None,
                           "kafka.sasl_password": None},
        "wrong password": {"kafka.sasl_username": "agent", "kafka.sasl_password": wrong},
        "plaintext": {"kafka.security_protocol": "PLAINTEXT", "kafka.sasl_username": None,
                      "kafka.sasl_password": None, "kafka.ssl_cafile": None},
    }  # fmt: skip
    who = changed(settings, updates[client])
    for args in (("topics", "create"), ("replay", "--format", "jsonl"), ("worker",)):
        began = time.monotonic()
        done = ledger(who, *args, timeout=60)
        took = time.monotonic() - began
        assert done.returncode != 0
        assert took < 45, f"{args}: refused only after {took:.0f}s"
        assert "Traceback" not in done.stderr, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines[0].startswith("error: "), done.stderr
        assert said in lines[0], done.stderr
        assert len(lines) == 2, done.stderr
        assert lines[1].startswith("hint: "), done.stderr
        assert wrong not in done.stdout + done.stderr
    # The SDK says the same.
    with pytest.raises(LedgerError, match=said.replace("(", r"\(").replace(")", r"\)")):
        async with Publisher(who) as publisher:
            await publisher.run_started("run-refused")
