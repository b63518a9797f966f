"""The circuit breaker against a real broker, a real ``ledger worker`` and a receiver that
does NOT dedupe: the endpoint goes down (connections refused), its circuit opens, later
deliveries wait (``circuit_open``, no attempt at the receiver or in the ledger), the
endpoint comes back, a half-open probe closes the circuit, and every delivery arrives
exactly once; the projection shows the circuit and the waiting; ``ledger verify`` agrees.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.endpoint_secrets import new_encryption_key, new_webhook_secret
from config.settings import Settings, changed
from events.delivery import DeliveryClaimed
from events.delivery_state import Status
from events.endpoints import (
    EndpointCircuitClosed,
    EndpointCircuitHalfOpened,
    EndpointCircuitOpened,
    decode_endpoint_event,
)
from events.waiting import DeliveryHeld, WaitReason
from tests.fixtures.broker import ReadTopic
from tests.fixtures.receiver import ReceiverFactory
from tests.fixtures.worker import fast_workers, wait_for
from tests.streams.matrix import publish
from tests.streams.test_endpoint_registry import Stack, free_port

OPEN_S = 5.0


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
        {
            "endpoints.encryption_keys": [new_encryption_key()],
            "endpoints.recheck_s": 0.5,
            "breaker.window_s": 60.0,
            "breaker.min_sends": 4,
            "breaker.failure_ratio": 0.5,
            "breaker.open_s": OPEN_S,
        },
    )
    made = Stack(fast, tmp_path, read_topic, receiver, secret)
    yield made
    made.stop()


def projected(dsn_path: Path) -> tuple[dict[str, str], dict[str, str | None]]:
    with sqlite3.connect(dsn_path) as db:
        circuits = dict(db.execute("SELECT endpoint_id, circuit FROM endpoints").fetchall())
        waiting = dict(db.execute("SELECT idempotency_key, waiting FROM deliveries").fetchall())
    return circuits, waiting


async def test_an_endpoint_down_opens_its_circuit_and_every_delivery_arrives_once_after(
    stack: Stack,
) -> None:
    receiver, live = stack.receiver, stack.tmp / "live.sqlite3"
    stack.ledger(
        "add", "acme", "--channel", "webhook", "--address", stack.hooks(), "--secret", stack.secret
    )
    stack.workers.start("w1")
    stack.projection.start()
    receiver.refuse()  # down: every connection refused

    async def circuit() -> str:
        shown = await asyncio.to_thread(stack.ledger, "show", "acme", "--json")
        return str(json.loads(shown.stdout)["circuit"])

    first = await publish(stack.settings, "first", stack.specs("f", 4))

    async def opened() -> bool:
        return await circuit() != "closed"

    await wait_for(opened, 60, "the circuit to open after 4 refused sends")
    later: list[str] = []
    for n in range(6):  # one run each: requested one after another
        later += await publish(stack.settings, f"later-{n}", stack.specs(f"l{n}-", 1))

    async def later_waiting() -> bool:
        states = await stack.view()
        return all(k in states and states[k].waiting is WaitReason.CIRCUIT_OPEN for k in later)

    await wait_for(later_waiting, 60, "the later deliveries to wait as circuit_open")

    async def projected_waiting() -> bool:
        try:
            circuits, waiting = await asyncio.to_thread(projected, live)
        except sqlite3.Error:
            return False
        return circuits.get("acme") in {"open", "half_open"} and all(
            waiting.get(k) == "circuit_open" for k in later
        )

    await wait_for(projected_waiting, 60, "the projection to show the circuit and the waiting")
    await asyncio.sleep(OPEN_S + 2)  # at least one probe while still down: it fails, reopens

    receiver.resume()
    states = await stack.settled(first + later, {Status.CONFIRMED})
    assert await circuit() == "closed"

    # The registry's log: opened, half-opened (a probe failed while down: opened again),
    # then closed by a probe's success.
    transitions = [
        decode_endpoint_event(m.value)
        for m in await stack.read_topic(stack.settings.kafka.topic_endpoints, raw=True)
    ]
    kinds = [type(e) for e in transitions]
    assert kinds.count(EndpointCircuitOpened) >= 2, kinds
    assert EndpointCircuitHalfOpened in kinds
    assert kinds[-1] is EndpointCircuitClosed
    probes = {
        e.endpoint.breaker.probe
        for e in transitions
        if isinstance(e, EndpointCircuitHalfOpened) and e.endpoint.breaker is not None
    }

    # Exactly once at a receiver that does not dedupe; nothing sent while waiting.
    assert all(receiver.accepted(k) == 1 for k in first + later), "each arrives exactly once"
    assert all(len(receiver.requests(key=k, method="POST")) == 1 for k in first + later)
    records = await stack.read_topic(stack.settings.kafka.topic_deliveries)
    claims = [e.idempotency_key for e in records if isinstance(e, DeliveryClaimed)]
    for key in later:
        if key in probes:
            continue  # a probe is an attempt, by design
        assert states[key].attempt == 1, "waiting made no attempt: the one is the delivery"
        assert claims.count(key) == 1, "claimed once, after the circuit closed"
    held = [e for e in records if isinstance(e, DeliveryHeld)]
    assert {h.idempotency_key for h in held} >= set(later) - probes
    assert all(h.reason is WaitReason.CIRCUIT_OPEN for h in held)
    assert all(s.waiting is None for s in states.values())

    async def projected_closed() -> bool:
        circuits, _ = await asyncio.to_thread(projected, live)
        return circuits.get("acme") == "closed"

    await wait_for(projected_closed, 60, "the projection to show the circuit closed")
    await stack.projection.matches(states)  # and ``ledger verify``: rebuilt == live
