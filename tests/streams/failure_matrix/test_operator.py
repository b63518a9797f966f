"""The operator's loop on the real broker: what the ledger cannot settle, a person settles
with ``ledger resolve`` and ``ledger redrive``, each a signed event folded like any other.

A receiver that does NOT dedupe, real ``ledger worker`` processes and the live projection
the CLI selects from; every CLI call is the real command in a subprocess. Each test checks
what the receiver holds (exactly one of each key), who acted and why (``operator_actions``)
and that ``ledger verify`` finds rebuilt equal to live.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial

import pytest

from clients import DeliverySpec
from events.delivery_state import Status
from events.outcomes import LookupOutcome
from ledger.stack import settings_env
from projections import open_store
from projections.fold import Row
from tests.fixtures.broker import ReadTopic
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import Fault, WebhookDriver
from tests.streams.failure_matrix.stacks import Stack, StackPool
from tests.streams.matrix import posts, publish


@pytest.fixture
async def no_lookup(
    stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A plain receiver without dedupe, its endpoint without a lookup URL; one worker."""
    make = partial(WebhookDriver, "plain", lookup=False)
    stack = await stack_pool.get("operator-no_lookup", make, read_topic, shared=False)
    stack.workers.start("w1")
    yield stack
    stack_pool.release()


@pytest.fixture
async def plain(
    stack_pool: StackPool, read_topic: ReadTopic
) -> AsyncIterator[Stack[WebhookDriver]]:
    """A plain receiver without dedupe, with lookups; one worker."""
    stack = await stack_pool.get("operator-plain", WebhookDriver, read_topic, shared=False)
    stack.workers.start("w1")
    yield stack
    stack_pool.release()


def ledger(
    stack: Stack[WebhookDriver], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``ledger ARGS`` against the stack's topics and live projection, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args, "--dsn", stack.projection.dsn],
        env=settings_env(stack.settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def ledger_async(stack: Stack[WebhookDriver], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(ledger, stack, *args)


def projected(stack: Stack[WebhookDriver], sql: str, params: tuple[object, ...] = ()) -> list[Row]:
    store = open_store(stack.projection.dsn)
    try:
        store.prepare("read")
        return store.rows(sql, params)
    finally:
        store.close()


async def until_projected(stack: Stack[WebhookDriver], keys: list[str], status: str) -> None:
    """The live projection (what the CLI selects from) shows ``keys`` in ``status``."""

    async def shown() -> bool:
        try:
            seen = await asyncio.to_thread(stack.projection.statuses)
        except Exception:  # the projector may not have created its tables yet
            return False
        return all(seen.get(k, ("", None))[0] == status for k in keys)

    await wait_for(shown, 60, f"the projection to show {len(keys)} deliveries {status}")


def actions_of(stack: Stack[WebhookDriver], keys: list[str]) -> list[Row]:
    marks = ", ".join("?" * len(keys))
    return projected(
        stack,
        f"SELECT * FROM operator_actions WHERE idempotency_key IN ({marks})",
        tuple(keys),
    )


async def records(stack: Stack[WebhookDriver], read_topic: ReadTopic) -> int:
    return len(await read_topic(stack.settings.kafka.topic_deliveries, raw=True))


async def test_unknowns_without_a_lookup_are_settled_by_the_operator_with_evidence(
    no_lookup: Stack[WebhookDriver],
) -> None:
    stack, receiver = no_lookup, no_lookup.driver.receiver
    # Two the receiver took (its answer lost or a 5xx after accepting), two it never took
    # (held past the deadline, then refused): all four UNKNOWN, no lookup to tell them apart.
    faults = (
        Fault.TIMEOUT_AFTER_ACCEPT,
        Fault.ERROR_AFTER_ACCEPT,
        Fault.NOT_TAKEN,
        Fault.NOT_TAKEN,
        None,
    )
    keys = await stack.publish("run-op-a", faults)
    faulted = [k for k, f in zip(keys, faults, strict=True) if f is not None]
    clean = [k for k, f in zip(keys, faults, strict=True) if f is None]
    await stack.until(clean, {Status.CONFIRMED}, "the clean one CONFIRMED")

    async def unresolved() -> bool:
        states = await stack.view()
        return all(
            states[k].status is Status.UNKNOWN and states[k].reconciled is LookupOutcome.UNSUPPORTED
            for k in faulted
        )

    await wait_for(unresolved, 60, "UNKNOWN with no lookup to settle it")
    await until_projected(stack, faulted, "UNKNOWN")
    has = [k for k in faulted if receiver.accepted(k) == 1]
    lacks = [k for k in faulted if receiver.accepted(k) == 0]
    assert len(has) == 2, (has, lacks)
    assert len(lacks) == 2, (has, lacks)

    # The operator asks the receiver, and settles each by what it says: all at once.
    receiver_ids = {}
    for key in has:
        event = receiver.event(key)
        assert event is not None
        receiver_ids[key] = event.receiver_id
    done = await asyncio.gather(
        *(
            ledger_async(
                stack, "resolve", key, "--delivered", "--receiver-id", receiver_ids[key],
                "--reason", "the receiver's log has it", "--as", "alice",
            )
            for key in has
        ),
        *(
            ledger_async(
                stack, "resolve", key, "--not-delivered",
                "--reason", "the receiver has no such event", "--as", "alice",
            )
            for key in lacks
        ),
    )  # fmt: skip
    for result in done:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stderr

    states = await stack.until(faulted, {Status.CONFIRMED}, "every UNKNOWN settled")
    for key in has:
        assert states[key].settled_by == "alice"
        assert states[key].provider_message_id == receiver_ids[key]
        assert states[key].attempt == 1  # nothing sent again
        assert posts(receiver, key) == 1
    for key in lacks:
        assert states[key].settled_by is None  # the new attempt's own outcome settled it
        assert states[key].attempt == 2
        assert states[key].fencing_token >= 2
        assert posts(receiver, key) == 2  # the one never taken, and the new attempt
    for key in keys:
        assert receiver.accepted(key) == 1, key  # exactly one of each key, no dedupe
    await stack.matches()  # the projection shows it; ledger verify: identical

    actions = {row["idempotency_key"]: row for row in actions_of(stack, faulted)}
    assert set(actions) == set(faulted)
    for key, row in actions.items():
        assert (row["action"], row["operator"], row["result"]) == ("resolve", "alice", "applied")
        assert row["outcome"] == ("delivered" if key in has else "not_delivered")
        assert row["receiver_id"] == receiver_ids.get(key)
        assert row["reason"].startswith("the receiver")
        assert row["seen_status"] == "UNKNOWN"
    settled = projected(stack, "SELECT idempotency_key, settled_by FROM deliveries")
    assert {r["idempotency_key"] for r in settled if r["settled_by"] == "alice"} == set(has)


async def test_failed_deliveries_are_redriven_once_even_by_two_operators_at_once(
    plain: Stack[WebhookDriver], read_topic: ReadTopic
) -> None:
    stack, receiver = plain, plain.driver.receiver
    down = receiver.webhook_url("down")
    # Three runs to the endpoint that refused for good (410) while it was misconfigured,
    # one that reached it before, and one FAILED elsewhere that stays out of the selection.
    refused = [f"run-op-b{i}" for i in range(3)]
    specs = {
        run: DeliverySpec(channel="webhook", recipient=down, payload={"r": run}) for run in refused
    }
    specs["run-op-ok"] = DeliverySpec(channel="webhook", recipient=down, payload={"ok": 1})
    elsewhere = DeliverySpec(
        channel="webhook", recipient=receiver.webhook_url("elsewhere"), payload={}
    )
    specs["run-op-else"] = elsewhere
    keys: dict[str, str] = {}
    for run, spec in specs.items():
        key = stack.driver.key(run, spec)
        if run != "run-op-ok":
            stack.driver.inject(key, Fault.REJECTED)
        [keys[run]] = await publish(stack.settings, run, [spec])
    failed = [keys[run] for run in refused]
    await stack.until([*failed, keys["run-op-else"]], {Status.FAILED}, "FAILED (410)")
    await stack.until([keys["run-op-ok"]], {Status.CONFIRMED}, "the one before CONFIRMED")
    await until_projected(stack, [*failed, keys["run-op-else"]], "FAILED")
    await until_projected(stack, [keys["run-op-ok"]], "CONFIRMED")
    select = ("redrive", "--recipient", down, "--state", "FAILED", "--reason", "endpoint fixed")

    # A dry run says exactly what would happen, and appends nothing.
    before = await records(stack, read_topic)
    dry = await ledger_async(stack, *select, "--as", "alice", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for key in failed:
        assert f"would redrive: {key} (FAILED, run run-op-b" in dry.stdout, dry.stdout
    assert keys["run-op-else"][:16] not in dry.stdout
    assert "dry run: nothing appended" in dry.stdout
    # More than --limit: refused as a whole, in one line, nothing appended either.
    over = await ledger_async(stack, *select, "--as", "alice", "--limit", "2")
    assert over.returncode == 2, over.stdout + over.stderr
    assert over.stderr.splitlines()[0] == (
        f"error: 3 deliveries match (recipient={down} state=FAILED), more than --limit 2"
    )
    unknown = await ledger_async(stack, "redrive", "f" * 64, "--reason", "r", "--as", "alice")
    assert unknown.returncode == 2, unknown.stdout + unknown.stderr
    assert "no delivery with key 'ffff" in unknown.stderr
    await asyncio.sleep(1)
    assert await records(stack, read_topic) == before
    assert len(receiver.requests(path="/hooks/down", method="POST")) == 4

    # Two operators redrive the same selection at the same moment: both see it FAILED (the
    # projection they select from is held still until both have appended).
    stack.projection.stop()
    alice, bob = await asyncio.gather(
        ledger_async(stack, *select, "--as", "alice"), ledger_async(stack, *select, "--as", "bob")
    )
    stack.projection.start()
    for result in (alice, bob):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "3 redrive event(s) appended" in result.stdout, result.stdout
    states = await stack.until(failed, {Status.CONFIRMED}, "redriven and CONFIRMED")
    for key in failed:
        assert receiver.accepted(key) == 1, key  # sent once more, whoever asked first
        assert posts(receiver, key) == 2  # the 410, then the redrive
        assert states[key].redrives == 1
        assert states[key].attempt == 2
    assert posts(receiver, keys["run-op-ok"]) == 1
    assert posts(receiver, keys["run-op-else"]) == 1  # not selected: still FAILED
    assert (await stack.view())[keys["run-op-else"]].status is Status.FAILED
    await stack.matches()

    # Each key: one operator's redrive applied, the other's refused, on the record.
    async def recorded() -> bool:
        return len(await asyncio.to_thread(actions_of, stack, failed)) == 2 * len(failed)

    await wait_for(recorded, 30, "both operators' redrives in operator_actions")
    rows = actions_of(stack, failed)
    for key in failed:
        mine = sorted((r for r in rows if r["idempotency_key"] == key), key=lambda r: r["result"])
        assert [r["result"] for r in mine] == ["applied", "refused"], mine
        assert {r["operator"] for r in mine} == {"alice", "bob"}
        assert all(r["scope"] == f"recipient={down} state=FAILED" for r in mine), mine
        assert all(r["reason"] == "endpoint fixed" for r in mine), mine
        refusal = mine[1]["refusal"]
        assert "already under way" in refusal or "CONFIRMED, which is final" in refusal, mine

    # What the command itself refuses it says, exits 1 and appends nothing.
    before = await records(stack, read_topic)
    wrong = await ledger_async(
        stack, "resolve", keys["run-op-else"], "--abandon", "--reason", "gone", "--as", "carol"
    )
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    assert "not FAILED" in wrong.stdout.replace("\n", " "), wrong.stdout
    settled = await ledger_async(stack, "redrive", failed[0], "--reason", "again", "--as", "carol")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "already settled (CONFIRMED) │ 1" in settled.stdout, settled.stdout
    await asyncio.sleep(1)
    assert await records(stack, read_topic) == before
