"""Reading a small single-partition topic whole: once to its end, or followed for as long
as the process runs (the endpoint registry, the API keys).

``read_to_end`` reads every record the topic has now, in log order (the CLI, before it
decides). ``TopicFollower`` reads from the beginning and then every new record, in a task
of the running loop, so a change applies without a restart; ``caught_up`` is set once it
has read to the end the topic had when reading began (at once for a topic that does not
exist yet, with one warning). It survives a broker that goes away: logged, and read again
from the beginning with a fresh reader (folds are idempotent, so a re-read changes
nothing). What a record means is the subclass's (``take``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from clients.committed_log import TRANSIENT, CommittedLog
from config.parts import KafkaSettings
from events.errors import LedgerError

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0
MISSING_TOPIC_RECHECK_S = 5.0
RETRY_S = 1.0


async def read_to_end(
    kafka: KafkaSettings,
    topic: str,
    take: Callable[[Any], None],
    *,
    missing_ok: bool = False,
    timeout_s: float = READ_TIMEOUT_S,
) -> None:
    """Hand every record ``topic`` has now to ``take``, in log order; a clear error if the
    topic does not exist (nothing, with ``missing_ok``) or its end is not reached in
    ``timeout_s``."""
    async with CommittedLog(kafka) as reader:
        partitions = await reader.partitions(topic, missing_ok=missing_ok)
        if not partitions:
            return
        ends = await reader.ends(partitions)
        reader.assign(partitions, dict.fromkeys(partitions, 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for tp in partitions:
            while await reader.position(tp) < ends[tp]:
                if loop.time() > deadline:
                    raise LedgerError(
                        f"could not read {topic} to its end in {timeout_s:.0f}s",
                        "check the broker ('ledger broker logs')",
                    )
                for record in (await reader.read(500, 1000)).get(tp, []):
                    take(record)


class TopicFollower(ABC):
    """Partition 0 of ``topic``, from its beginning, then followed in the background."""

    def __init__(
        self, kafka: KafkaSettings, topic: str, *, missing: str, poll_s: float = 0.2
    ) -> None:
        self._kafka = kafka
        self._topic = topic
        self._missing = missing  # what a missing topic means, for its one warning
        self._poll_ms = int(poll_s * 1000)
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned_missing = False

    @property
    def ready(self) -> bool:
        """True once the topic was read to the end it had when reading began."""
        return self.caught_up.is_set()

    @abstractmethod
    def take(self, record: Any) -> None:
        """One record, in log order (decode, fold; a bad one skipped and counted)."""

    def start(self) -> None:
        """Follow the topic in a task of the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.follow())

    async def stop(self) -> None:
        """Stop following."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def follow(self) -> None:
        """Read from the beginning, then every new record, until cancelled."""
        tp = TopicPartition(self._topic, 0)
        while True:
            reader = CommittedLog(self._kafka)
            try:
                await self._follow(reader, tp)
            except TRANSIENT as exc:
                log.warning("reading %s: %s (trying again)", tp.topic, exc)
                await reader.stop()
                await asyncio.sleep(RETRY_S)
            except BaseException:
                await reader.stop()
                raise

    async def _follow(self, reader: CommittedLog, tp: TopicPartition) -> None:
        await reader.start()
        while not await reader.partitions(tp.topic, missing_ok=True):
            if not self._warned_missing:
                self._warned_missing = True
                log.warning(
                    "no topic %s: %s (create it with 'ledger topics create')",
                    tp.topic,
                    self._missing,
                )
            self.caught_up.set()
            await asyncio.sleep(MISSING_TOPIC_RECHECK_S)
        reader.assign([tp], {tp: 0})  # from the beginning, every time
        end = (await reader.ends([tp]))[tp]
        if end == 0:
            self.caught_up.set()
        while True:
            for record in (await reader.read(self._poll_ms, 1000)).get(tp, []):
                self.take(record)
            if not self.caught_up.is_set() and await reader.position(tp) >= end:
                self.caught_up.set()
