"""What the failure-matrix tests (tests/streams/failure_matrix/) and the other real-worker
tests share: publish, wait for states, point workers at a receiver, settle exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping

from clients import DeliverySpec, Publisher
from config.settings import Settings, changed
from events.delivery_state import DeliveryState, Status
from ledger.simulator.background import BackgroundSimulator
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import LedgerView, WorkerFactory, WorkerProcess, wait_for

TIMEOUT = 90


async def publish(settings: Settings, run_id: str, specs: list[DeliverySpec]) -> list[str]:
    async with Publisher(settings, producer_name="test-agent") as publisher:
        requests = await publisher.run_succeeded(run_id, "sha256:r", specs)
    return [r.idempotency_key for r in requests]


async def until(
    view: LedgerView,
    keys: list[str],
    statuses: set[Status],
    workers: list[WorkerProcess],
    what: str,
    receiver: BackgroundSimulator | None = None,
) -> dict[str, DeliveryState]:
    """Wait until every key is in one of ``statuses``; a timeout names the keys that are
    not, and (given the receiver) the keys it accepted more than once: a ledger that never
    settles may hide the worse outcome."""

    async def done() -> bool:
        for worker in workers:
            assert worker.alive(), f"worker {worker.name} died:\n{last_words(worker.output())}"
        states = await view()
        return all(k in states and states[k].status in statuses for k in keys)

    try:
        await wait_for(done, TIMEOUT, what)
    except AssertionError as exc:
        states = await view()
        behind = {
            k[:12]: (s.status.value, s.attempt, s.last_error_class, s.reconciled, s.lookups)
            if (s := states.get(k))
            else None
            for k in keys
            if k not in states or states[k].status not in statuses
        }
        twice = {k[:12]: n for k in keys if receiver and (n := receiver.accepted(k)) > 1}
        story = "\n".join(f"{w.name}:\n{ownership(w.output())}" for w in workers)
        raise AssertionError(
            f"{exc}; {len(behind)} not there: {behind}; accepted more than once: {twice}\n{story}"
        ) from None
    return await view()


OWNERSHIP_MARKS = ("owns partitions", "rebuilt", "Recovery complete", "WARNING", "ERROR")


def ownership(output: str, lines: int = 30) -> str:
    """What a worker that stopped making progress logged about its partitions: which it
    owned, the timers it rebuilt, its warnings (the cause of a stall, without the noise)."""
    marked = [line[:240] for line in output.splitlines() if any(m in line for m in OWNERSHIP_MARKS)]
    return "\n".join(marked[-lines:])


def last_words(output: str) -> str:
    """The first error a dead worker logged (the cause), then the end of its log."""
    lines = output.splitlines()
    marks = ("Traceback", "CRITICAL")
    first = next((i for i, line in enumerate(lines) if any(m in line for m in marks)), None)
    cause = "\n".join(lines[first : first + 40]) if first is not None else ""
    return f"{cause[:4000]}\n...\n{output[-2000:]}"


def use(
    factory: WorkerFactory,
    receiver: BackgroundSimulator,
    projection: LiveProjection,
    *,
    lookup: bool = True,
    receiver_dedupes: bool = False,
    changes: Mapping[str, object] | None = None,
) -> Settings:
    """Point the workers at ``receiver`` and start the live projection beside them
    (``changes``: other settings, by dotted name)."""
    settings = receiver.settings(factory.settings, lookup=lookup, receiver_dedupes=receiver_dedupes)
    factory.settings = changed(settings, changes or {})
    projection.settings = factory.settings
    projection.start()
    return factory.settings


def posts(receiver: BackgroundSimulator, key: str) -> int:
    return len(receiver.requests(key=key, method="POST"))


async def settled_once(
    view: LedgerView,
    receiver: BackgroundSimulator,
    projection: LiveProjection,
    keys: list[str],
    workers: list[WorkerProcess],
) -> dict[str, DeliveryState]:
    """Every key CONFIRMED, each accepted exactly once from one request, never two open at
    once; the live projection shows the same."""
    states = await until(view, keys, {Status.CONFIRMED}, workers, "all CONFIRMED", receiver)
    for key in keys:
        assert receiver.accepted(key) == 1, (key, states[key])
        assert posts(receiver, key) == 1, (key, states[key])
        assert receiver.max_concurrent(key) == 1, key
    await projection.matches(await view())
    return states
