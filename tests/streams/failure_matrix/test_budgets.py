"""A send budget on the real broker: an agent limited to 100 per window publishes 101
deliveries, spread over every partition and two workers; exactly 100 reach a receiver that
does NOT dedupe, the 101st waits (PENDING, over_budget, shown in the projection and in
``ledger status``) until an operator releases it with ``ledger budgets release``; then it
arrives exactly once, and ``ledger verify`` finds rebuilt equal to live.

Every CLI call is the real command in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from clients import Publisher
from events.delivery_state import Status
from events.waiting import WaitReason
from ledger.stack import settings_env
from projections import open_store
from projections.fold import Row
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool
from tests.streams.matrix import posts

AGENT = "runaway-agent"
LIMIT = 100


@pytest.fixture
async def budgeted(
    stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A plain receiver without dedupe; no worker started yet."""
    stack = await stack_pool.get("budgets-plain", WebhookDriver, read_topic, shared=False)
    yield stack
    stack_pool.release()


def ledger(stack: Stack[WebhookDriver], *args: str) -> subprocess.CompletedProcess[str]:
    """``ledger ARGS`` with the stack's settings, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def projected(stack: Stack[WebhookDriver], sql: str) -> list[Row]:
    store = open_store(stack.projection.dsn)
    try:
        store.prepare("read")
        return store.rows(sql)
    finally:
        store.close()


async def publish_as(
    stack: Stack[WebhookDriver], agent: str, run_id: str, count: int, first: int = 0
) -> list[str]:
    specs = [stack.driver.spec(run_id, n) for n in range(first, first + count)]
    async with Publisher(stack.settings, producer_name=agent) as publisher:
        requests = await publisher.run_succeeded(run_id, "sha256:r", specs)
    return [r.idempotency_key for r in requests]


async def test_an_agent_over_its_budget_is_held_exactly_and_released_by_an_operator(
    budgeted: Stack[WebhookDriver],
) -> None:
    stack, receiver = budgeted, budgeted.driver.receiver
    dsn = stack.projection.dsn
    ok(
        await asyncio.to_thread(
            ledger, stack, "budgets", "set", AGENT, "--limit", str(LIMIT), "--window", "1h",
            "--reason", "a runaway loop", "--as", "ana",
        )
    )  # fmt: skip
    stack.workers.start("w1")
    stack.workers.start("w2")
    # 101 deliveries of the budgeted agent in several runs at once (every partition, both
    # workers racing to spend), and a few of another agent, which no budget holds.
    batches = await asyncio.gather(
        *(publish_as(stack, AGENT, f"run-budget-{i}", 20, 20 * i) for i in range(5)),
        publish_as(stack, AGENT, "run-budget-5", 1, 100),
        publish_as(stack, "quiet-agent", "run-quiet", 3),
    )
    keys = [k for batch in batches[:6] for k in batch]
    quiet = batches[6]
    assert len(set(keys)) == LIMIT + 1

    async def settled_but_one() -> bool:
        states = await stack.view()
        done = [k for k in keys if k in states and states[k].status is Status.CONFIRMED]
        held = [
            k
            for k in keys
            if k in states
            and states[k].status is Status.PENDING
            and states[k].waiting is WaitReason.OVER_BUDGET
        ]
        others = all(k in states and states[k].status is Status.CONFIRMED for k in quiet)
        return len(done) == LIMIT and len(held) == 1 and others

    await wait_for(settled_but_one, 120, f"{LIMIT} CONFIRMED and one held over budget")
    states = await stack.view()
    [over] = [k for k in keys if states[k].status is Status.PENDING]
    # Still held a while later: never claimed, never sent.
    await asyncio.sleep(3)
    states = await stack.view()
    assert (states[over].status, states[over].attempt) == (Status.PENDING, 0)
    assert posts(receiver, over) == 0
    for key in keys:
        if key != over:
            assert receiver.accepted(key) == 1, key
            assert posts(receiver, key) == 1, key
    for key in quiet:
        assert receiver.accepted(key) == 1, key

    # The projection shows it waiting, with its agent; status and budgets show count it.
    async def shown_held() -> bool:
        try:
            rows = await asyncio.to_thread(
                projected, stack, "SELECT idempotency_key, agent FROM deliveries "
                "WHERE waiting = 'over_budget'",
            )  # fmt: skip
        except Exception:  # the projector may not have created its tables yet
            return False
        return [(r["idempotency_key"], r["agent"]) for r in rows] == [(over, AGENT)]

    await wait_for(shown_held, 60, "the projection to show the held delivery")
    status = json.loads(
        ok(await asyncio.to_thread(ledger, stack, "status", "--json", "--dsn", dsn))
    )
    assert [(r["agent"], r["held"]) for r in status["over_budget"]] == [(AGENT, 1)]
    text = ok(await asyncio.to_thread(ledger, stack, "status", "--dsn", dsn))
    assert f"held over budget: 1: {AGENT} 1" in text
    shown = json.loads(
        ok(await asyncio.to_thread(ledger, stack, "budgets", "show", AGENT, "--json", "--dsn", dsn))
    )
    [budget] = shown["budgets"]
    assert (budget["limit"], budget["window"], budget["spent"], budget["held"]) == (
        LIMIT, "1h", LIMIT, 1,
    )  # fmt: skip
    assert shown["refused_records"] == 0
    text = ok(await asyncio.to_thread(ledger, stack, "budgets", "show", "--dsn", dsn))
    assert text.splitlines() == [
        f"{AGENT} on every channel: 100 of 100 spent in the window of 1h ending "
        f"{budget['window_end']} (limit 100); held now: 1"
    ]

    # The operator releases one: it arrives, exactly once.
    released = ok(
        await asyncio.to_thread(
            ledger, stack, "budgets", "release", AGENT, "--count", "1",
            "--reason", "checked: the last one is legitimate", "--as", "ana",
        )
    )  # fmt: skip
    assert "released: 1" in released
    await stack.until(keys, {Status.CONFIRMED}, "the released one CONFIRMED")
    assert receiver.accepted(over) == 1
    assert posts(receiver, over) == 1
    for key in [*keys, *quiet]:
        assert receiver.accepted(key) == 1, key
    await stack.matches()  # the projection shows it; ledger verify: identical
    rows = await asyncio.to_thread(
        projected, stack, "SELECT COUNT(*) AS n FROM deliveries WHERE waiting IS NOT NULL"
    )
    assert rows[0]["n"] == 0
