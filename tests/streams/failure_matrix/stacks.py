"""A channel's fake, workers and a live projection on topics of their own, for matrix rows.

Rows whose settings are the same and that do not fault a worker share one stack (and its
running worker): each row has its own keys, and its faults are armed on those keys before
it publishes. A row that kills a worker gets a stack of its own. The pool keeps one shared
stack at a time: the table lists a stack's rows together, so each is built once.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pytest

from config.settings import Settings, changed
from events.delivery_state import DeliveryState, Status
from tests.fixtures.broker import ReadTopic, fresh_topics
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import (
    LedgerView,
    WorkerFactory,
    WorkerProcess,
    fast_workers,
    ledger_view_of,
)
from tests.streams.failure_matrix.drivers import Driver, Fault
from tests.streams.matrix import publish, until

D = TypeVar("D", bound=Driver)


def plain_receiver(**config: object) -> pytest.MarkDecorator:
    """The ``webhook`` fixture (conftest.py) against the plain receiver only, configured
    with ``config`` (WebhookDriver fields): a row without a webhook delivery, say."""
    return pytest.mark.parametrize(
        "webhook", [{"hooks": "plain", **config}], indirect=True, ids=["plain"]
    )


PLAIN_ONLY = plain_receiver()

# The rows about publishing run in both of the publisher's modes at no more cost: the
# receiver kit's variant publishes in the record mode (which receiver hears the one send
# is beside the point of a row about the publisher or the claim).
BOTH_MODES = pytest.mark.parametrize(
    "webhook",
    [{"hooks": "plain"}, {"hooks": "kit", "mode": "record"}],
    indirect=True,
    ids=["plain", "kit-record"],
)
RECORD_MODE = pytest.mark.parametrize(
    "webhook", [{"hooks": "plain", "mode": "record"}], indirect=True, ids=["record"]
)


@dataclass
class Stack(Generic[D]):
    """One channel's fake, the workers pointed at it and the live projection beside them."""

    driver: D
    settings: Settings
    workers: WorkerFactory
    projection: LiveProjection
    view: LedgerView
    # The worker every row of a shared stack uses (a stack of its own starts its own).
    worker: WorkerProcess | None = None

    def configure(self, changes: Mapping[str, object]) -> Settings:
        """The workers started from now on run with ``changes`` (settings by dotted name);
        their settings."""
        self.workers.settings = changed(self.settings, changes)
        return self.workers.settings

    async def publish(self, run_id: str, faults: tuple[Fault | None, ...] = (None,)) -> list[str]:
        """One delivery per entry of ``faults`` in run ``run_id``, each fault armed on its
        key before the run is published; the keys."""
        specs = [self.driver.spec(run_id, n) for n in range(len(faults))]
        keys = [self.driver.key(run_id, spec) for spec in specs]
        for key, fault in zip(keys, faults, strict=True):
            if fault is not None:
                self.driver.inject(key, fault)
        published = await publish(self.settings, run_id, specs)
        assert published == keys, "the driver's keys are the publisher's"
        return keys

    async def until(
        self, keys: list[str], statuses: set[Status], what: str
    ) -> dict[str, DeliveryState]:
        """Wait until every key is in one of ``statuses`` while the last worker started lives."""
        return await until(self.view, keys, statuses, self.workers.started[-1:], what)

    async def killed(self, fault: str) -> None:
        """A worker that dies (SIGKILL) at ``fault``, waited for."""
        doomed = self.workers.start("w1", faults=(fault,))
        await asyncio.to_thread(doomed.process.wait, 60)
        assert doomed.process.returncode == -signal.SIGKILL

    async def matches(self) -> None:
        """The live projection shows the ledger's final state, and rebuilt equals live."""
        await self.projection.matches(await self.view())

    def close(self) -> None:
        self.workers.stop_all()
        self.projection.stop()
        self.driver.stop()


@dataclass
class StackPool:
    """Builds stacks; keeps the last shared one until a row asks for another."""

    broker: Settings
    tmp: pytest.TempPathFactory
    shared: tuple[str, Stack[Any]] | None = None
    own: list[Stack[Any]] = field(default_factory=list)

    async def get(
        self, name: str, make: Callable[[], D], read_topic: ReadTopic, *, shared: bool
    ) -> Stack[D]:
        """The stack ``name`` (shared: the running one if it is that), its view read with
        this test's ``read_topic``."""
        if shared and self.shared is not None and self.shared[0] == name:
            return self.shared[1]
        self.close()
        stack = await self._build(name, make(), read_topic, start_worker=shared)
        if shared:
            self.shared = (name, stack)
        else:
            self.own.append(stack)
        return stack

    async def _build(
        self, name: str, driver: D, read_topic: ReadTopic, *, start_worker: bool
    ) -> Stack[D]:
        tmp = self.tmp.mktemp(name)
        try:
            settings = driver.point(fast_workers(await fresh_topics(self.broker, tmp / "data")))
        except BaseException:
            driver.stop()
            raise
        workers = WorkerFactory(settings, tmp)
        projection = LiveProjection(
            settings, f"sqlite://{tmp / 'live.sqlite3'}", tmp / "project.log"
        )
        projection.start()
        view = ledger_view_of(read_topic, settings.kafka.topic_deliveries)
        stack = Stack(driver, settings, workers, projection, view)
        if start_worker:
            stack.worker = workers.start("w1")
        return stack

    def release(self) -> None:
        """Close the stacks of their own (after their row)."""
        for stack in self.own:
            stack.close()
        self.own.clear()

    def close(self) -> None:
        self.release()
        if self.shared is not None:
            self.shared[1].close()
            self.shared = None
