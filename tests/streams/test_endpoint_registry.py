"""The endpoint registry against a real broker and real ``ledger worker`` processes.

A paused or disabled endpoint holds its deliveries (PENDING, waiting, no request at the
receiver) and releases them in request order, each exactly once, at a receiver that does
NOT dedupe; a rotated secret is verified by the official ``standardwebhooks`` library (the
simulator's receiver) before, during and after the rotation; an endpoint added with
``ledger endpoints add`` is used by a running worker; an endpoint's retry policy limits the
attempts at a receiver that always answers 500, and an update of it applies without a
restart; a bad record on the registry or the budgets topic is dead-lettered exactly once
(by the live projector, not by each worker) while the workers keep going; the log never
holds a secret in clear; ``ledger verify`` is identical after each
scenario.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from clients import DeliverySpec
from clients.endpoint_secrets import new_encryption_key, new_webhook_secret
from config.settings import Settings, changed
from events.codec import EventDecodeError, decode
from events.deadletter import DeadLetter
from events.delivery import DeliveryClaimed
from events.delivery_state import DeliveryState, Status
from events.waiting import DeliveryHeld, WaitReason
from ledger.simulator.background import BackgroundSimulator
from ledger.simulator.faults import FaultKind
from ledger.stack import settings_env
from tests.fixtures.broker import ReadTopic
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import WorkerFactory, fast_workers, ledger_view_of, wait_for
from tests.streams.matrix import publish, until

PICKUP_S = 3.0  # the registry is polled every 0.2 s; a worker sees a change well within this


def free_port() -> int:
    """A free port below the ephemeral range (32768-60999), on 127.0.0.1."""
    for port in range(23100, 23900):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 23100-23899")


class Stack:
    """One test's settings (with an encryption key), worker, projection and receiver."""

    def __init__(
        self,
        settings: Settings,
        tmp: Path,
        read_topic: ReadTopic,
        receiver: BackgroundSimulator,
        secret: str,
    ) -> None:
        self.settings = settings
        self.secret = secret  # the endpoint's own, the receiver's too
        self.tmp = tmp
        self.receiver = receiver
        self.read_topic = read_topic
        self.workers = WorkerFactory(settings, tmp)
        self.projection = LiveProjection(
            settings, f"sqlite://{tmp / 'live.sqlite3'}", tmp / "project.log"
        )
        self.view = ledger_view_of(read_topic, settings.kafka.topic_deliveries)

    def ledger(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ledger endpoints ...`` as an operator runs it."""
        env = settings_env(self.settings)
        env["LEDGER_OPERATOR"] = "ana"
        done = subprocess.run(
            [sys.executable, "-m", "ledger", "endpoints", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def hooks(self) -> str:
        return f"{self.receiver.base_url}/hooks/"

    def specs(self, prefix: str, n: int) -> list[DeliverySpec]:
        return [
            DeliverySpec(
                channel="webhook",
                recipient=self.receiver.webhook_url(f"{prefix}{i}"),
                payload={"i": i},
            )
            for i in range(n)
        ]

    async def settled(self, keys: list[str], statuses: set[Status]) -> dict[str, DeliveryState]:
        worker = self.workers.started[-1]
        return await until(self.view, keys, statuses, [worker], "settled", self.receiver)

    def stop(self) -> None:
        self.projection.stop()
        self.workers.stop_all()


@pytest.fixture
def stack(
    settings: Settings,
    tmp_path: Path,
    read_topic: ReadTopic,
    receiver_factory: ReceiverFactory,
) -> Iterator[Stack]:
    secret = new_webhook_secret()
    receiver = receiver_factory(
        dedupe=False, webhook_secret=secret, port=free_port(), control_port=None
    )
    fast = changed(
        fast_workers(settings),
        {"endpoints.encryption_keys": [new_encryption_key()], "endpoints.recheck_s": 0.5},
    )
    made = Stack(fast, tmp_path, read_topic, receiver, secret)
    yield made
    made.stop()


def projected_endpoints(dsn_path: Path) -> dict[str, tuple[str, str | None, int]]:
    with sqlite3.connect(dsn_path) as db:
        rows = db.execute("SELECT endpoint_id, state, paused_by, secrets FROM endpoints")
        return {r[0]: (r[1], r[2], r[3]) for r in rows.fetchall()}


def waiting_in_projection(dsn_path: Path) -> dict[str, str | None]:
    with sqlite3.connect(dsn_path) as db:
        return dict(db.execute("SELECT idempotency_key, waiting FROM deliveries").fetchall())


async def claims_in_order(stack: Stack) -> dict[int, list[str]]:
    """The run ids of the claims per partition, in log order."""
    order: dict[int, list[str]] = {}
    for message in await stack.read_topic(stack.settings.kafka.topic_deliveries, raw=True):
        try:
            event = decode(message.value)
        except EventDecodeError:
            continue
        if isinstance(event, DeliveryClaimed):
            order.setdefault(message.partition, []).append(event.idempotency_key)
    return order


@pytest.mark.parametrize(
    ("hold", "release", "reason"),
    [("pause", "resume", WaitReason.PAUSED), ("disable", "enable", WaitReason.DISABLED)],
)
async def test_a_held_endpoint_waits_then_releases_in_order_exactly_once(
    stack: Stack, hold: str, release: str, reason: WaitReason
) -> None:
    receiver = stack.receiver
    stack.ledger(
        "add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret", stack.secret
    )
    stack.ledger(hold, "acme", "--reason", "receiver maintenance")
    stack.workers.start("w1")
    stack.projection.start()
    keys: list[str] = []
    for n in range(6):  # one run each: requested one after another
        keys += await publish(stack.settings, f"run-{n}", stack.specs(f"h{n}-", 1))

    async def all_waiting() -> bool:
        states = await stack.view()
        return all(k in states and states[k].waiting is reason for k in keys)

    await wait_for(all_waiting, 60, f"every delivery waiting as {reason.value}")
    await asyncio.sleep(2 * stack.settings.endpoints.recheck_s + 1)
    states = await stack.view()
    assert all(s.status is Status.PENDING and s.attempt == 0 for s in states.values())
    assert receiver.requests(method="POST") == [], "a held endpoint receives nothing"
    held = [
        e
        for e in await stack.read_topic(stack.settings.kafka.topic_deliveries)
        if isinstance(e, DeliveryHeld)
    ]
    assert len(held) == len(keys), "one hold recorded per delivery, not one per recheck"
    assert all("by ana: receiver maintenance" in h.detail for h in held)

    async def projected_waiting() -> bool:
        try:
            seen = await asyncio.to_thread(waiting_in_projection, stack.tmp / "live.sqlite3")
        except sqlite3.Error:
            return False
        return all(seen.get(k) == reason.value for k in keys)

    await wait_for(projected_waiting, 60, "the projection to show them waiting")
    endpoints = await asyncio.to_thread(projected_endpoints, stack.tmp / "live.sqlite3")
    assert endpoints == {"acme": (reason.value, "ana" if reason is WaitReason.PAUSED else None, 1)}

    stack.ledger(release, "acme")
    states = await stack.settled(keys, {Status.CONFIRMED})
    assert all(receiver.accepted(k) == 1 for k in keys), "each arrives exactly once"
    assert all(len(receiver.requests(key=k, method="POST")) == 1 for k in keys)
    assert all(s.waiting is None and s.attempt == 1 for s in states.values())
    endpoints = await asyncio.to_thread(projected_endpoints, stack.tmp / "live.sqlite3")
    assert endpoints["acme"][0] == "active"
    # Claimed in request order (within each partition: the log's only order).
    requested_order = {k: i for i, k in enumerate(keys)}
    for partition_keys in (await claims_in_order(stack)).values():
        assert partition_keys == sorted(partition_keys, key=requested_order.__getitem__)
    await stack.projection.matches(states)


async def test_a_rotated_secret_signs_before_during_and_after_and_never_shows_in_the_log(
    stack: Stack,
) -> None:
    receiver, old, new = stack.receiver, stack.secret, new_webhook_secret()
    stack.ledger("add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret", old)
    stack.workers.start("w1")
    stack.projection.start()
    done: dict[str, DeliveryState] = {}

    async def one(run_id: str, status: Status = Status.CONFIRMED) -> str:
        [key] = await publish(stack.settings, run_id, stack.specs(run_id, 1))
        done.update(await stack.settled([key], {status}))
        return key

    before = await one("before")  # the receiver knows the old secret only
    assert receiver.accepted(before) == 1
    rotated = stack.ledger("rotate-secret", "acme", "--secret", new, "--overlap-s", "600")
    assert new not in rotated.stdout, "a secret given is never printed"
    await asyncio.sleep(PICKUP_S)
    during_old = await one("during-old")  # both sign: the old one verifies...
    receiver.configure(webhook_secret=new)
    during_new = await one("during-new")  # ...and so does the new one
    assert receiver.accepted(during_old) == receiver.accepted(during_new) == 1
    stack.ledger("rotate-secret", "acme", "--finish")
    await asyncio.sleep(PICKUP_S)
    after = await one("after")  # the new one signs
    assert receiver.accepted(after) == 1
    receiver.configure(webhook_secret=old)
    dropped = await one("after-old", Status.FAILED)  # the old one no longer does
    assert [r.signature_ok for r in receiver.requests(key=dropped, method="POST")] == [False]
    assert receiver.accepted(dropped) == 0
    # Nothing of either secret in clear anywhere in the registry's log.
    raw = b"".join(
        (m.value or b"") + (m.key or b"")
        for m in await stack.read_topic(stack.settings.kafka.topic_endpoints, raw=True)
    )
    assert raw, "the registry holds the endpoint"
    for secret in (old, new):
        body = secret.removeprefix("whsec_")
        for needle in (secret, body, base64.b64decode(body).hex()):
            assert needle.encode() not in raw
        assert base64.b64decode(body) not in raw
    shown = stack.ledger("show", "acme", "--json").stdout + stack.ledger("list").stdout
    assert old not in shown
    assert new not in shown
    await stack.projection.matches(done)


async def test_an_endpoint_added_while_the_worker_runs_is_used_without_a_restart(
    stack: Stack,
) -> None:
    receiver = stack.receiver  # verifies with the endpoint's own secret only
    worker = stack.workers.start("w1")
    stack.projection.start()
    [unknown] = await publish(stack.settings, "before-add", stack.specs("x", 1))
    done = dict(await stack.settled([unknown], {Status.FAILED}))  # signed with the global one
    assert receiver.accepted(unknown) == 0
    added = stack.ledger(
        "add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret", stack.secret
    )
    assert stack.secret not in added.stdout
    await asyncio.sleep(PICKUP_S)
    [key] = await publish(stack.settings, "after-add", stack.specs("y", 1))
    done.update(await stack.settled([key], {Status.CONFIRMED}))
    assert receiver.accepted(key) == 1
    assert worker.alive()
    assert len(stack.workers.started) == 1
    listed = stack.ledger("list", "--json").stdout
    assert '"id": "acme"' in listed
    assert '"state": "active"' in listed
    await stack.projection.matches(done)


async def test_a_registered_retry_policy_limits_the_attempts_and_an_update_needs_no_restart(
    stack: Stack,
) -> None:
    receiver = stack.receiver  # does not dedupe; every POST answers 500, nothing accepted
    receiver.fault(FaultKind.REJECT, status=500, count=10_000)
    quick = {"base_delay_s": 0.2, "max_delay_s": 0.5}
    three = json.dumps({**quick, "max_attempts": 3})  # the webhook default is 10
    stack.ledger(
        "add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret",
        stack.secret, "--lookup-url", receiver.webhook_lookup_url, "--retry-policy", three,
    )  # fmt: skip
    worker = stack.workers.start("w1")
    stack.projection.start()

    async def failed_after(run_id: str) -> tuple[str, DeliveryState]:
        [key] = await publish(stack.settings, run_id, stack.specs(run_id, 1))
        state = (await stack.settled([key], {Status.FAILED}))[key]
        await asyncio.sleep(1.5)  # nothing more arrives once it is FAILED
        return key, state

    key, state = await failed_after("three")
    assert len(receiver.requests(key=key, method="POST")) == 3, "exactly N attempts arrive"
    assert state.attempt == 3
    assert receiver.accepted(key) == 0
    done = {key: state}

    stack.ledger("update", "acme", "--retry-policy", json.dumps({**quick, "max_attempts": 2}))
    await asyncio.sleep(PICKUP_S)
    key, state = await failed_after("two")
    assert len(receiver.requests(key=key, method="POST")) == 2, "the update applies"
    assert state.attempt == 2
    done[key] = state
    assert worker.alive()
    assert len(stack.workers.started) == 1, "no restart"
    await stack.projection.matches(done)


async def test_bad_registry_and_budget_records_are_dead_lettered_once_and_workers_go_on(
    stack: Stack,
) -> None:
    kafka = stack.settings.kafka
    stack.ledger(
        "add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret", stack.secret
    )
    [acme] = await stack.read_topic(kafka.topic_endpoints, raw=True)
    workers = [stack.workers.start("w1"), stack.workers.start("w2")]  # each reads both topics
    stack.projection.start()
    bad = [
        (kafka.topic_endpoints, b"acme", b"\x00not json"),
        # A whole endpoint event under another endpoint's key: refused, not folded.
        (kafka.topic_endpoints, b"other", acme.value),
        (kafka.topic_budgets, b"my-agent", b'{"type": "budget.set", "agent": "my-agent"}'),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    await producer.start()
    try:
        positions = []
        for topic, key, value in bad:
            sent = await producer.send_and_wait(topic, value, key=key, partition=0)
            positions.append((topic, sent.partition, sent.offset))
    finally:
        await producer.stop()

    async def letters() -> list[DeadLetter]:
        found = await stack.read_topic(kafka.topic_deadletter, raw=True)
        return [DeadLetter.model_validate_json(m.value) for m in found]

    async def all_there() -> bool:
        return len(await letters()) >= len(bad)

    await wait_for(all_there, 60, "a dead letter per bad record")
    keys = await publish(stack.settings, "after-bad", stack.specs("z", 4))
    done = await stack.settled(keys, {Status.CONFIRMED})  # the workers keep going
    assert all(stack.receiver.accepted(k) == 1 for k in keys)
    await asyncio.sleep(3)  # any copy a worker would send has had time to arrive
    found = await letters()
    where = sorted((d.original_topic, d.original_partition, d.original_offset) for d in found)
    assert where == sorted(positions), "exactly one dead letter per bad record"
    assert all(d.detected_by == "projector" for d in found)
    by_position = {(d.original_topic, d.original_partition, d.original_offset): d for d in found}
    reasons = [by_position[p].reason for p in positions]
    assert "not an endpoint event" in reasons[0]
    assert "record key does not match" in reasons[1]
    assert "budget" in reasons[2]
    assert [by_position[p].original_value() for p in positions] == [v for _, _, v in bad]
    assert all(w.alive() for w in workers)
    # The projection's view of what it skipped holds them, with the same reasons.
    with sqlite3.connect(stack.tmp / "live.sqlite3") as db:
        skipped = {
            (t, p, o): r
            for t, p, o, r in db.execute(
                "SELECT topic, kafka_partition, record_offset, reason FROM skipped_records"
            )
        }
    assert {p: skipped.get(p) for p in positions} == dict(zip(positions, reasons, strict=True))
    # The registry still holds acme as it was: the mis-keyed copy changed nothing.
    assert '"id": "acme"' in stack.ledger("list", "--json").stdout
    await stack.projection.matches(done)
