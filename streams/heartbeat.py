"""The worker's heartbeat: how it measures the broker's clock, and says how far off it is.

Every ``interval_s`` the worker appends one small record, keyed by its id, to the
heartbeats topic (compacted; timestamps set by the broker: ``LogAppendTime``). The
broker's timestamp of that record, between the moment it was handed over and the moment it
was acknowledged, is one sample of the broker's clock (streams/broker_clock.py). The
record's value is this worker's latest estimate, so ``ledger status`` and the dashboard
show every worker's clock skew from the topic alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiokafka import AIOKafkaProducer

from clients.kafka_security import client_options
from config.parts import KafkaSettings, WorkerSettings
from streams.broker_clock import BrokerClock, Sample

log = logging.getLogger(__name__)

LOG_APPEND_TIME = 1  # aiokafka's RecordMetadata.timestamp_type for broker-set timestamps


def heartbeat_value(worker_id: str, clock: BrokerClock) -> dict[str, Any]:
    """What one heartbeat says about its worker."""
    why = clock.why_not()
    return {
        "worker_id": worker_id,
        "clock_offset_s": round(clock.offset_s, 4),
        "clock_uncertainty_s": round(min(clock.uncertainty_s, 1e9), 4),
        "clock_skew": why is not None and clock.measured,
        "acting": why is None,
        "why_not": why,
        "sent_at": time.time(),
    }


class Heartbeat:
    """Appends heartbeats (one in flight at a time) and feeds their samples to ``clock``."""

    def __init__(
        self, kafka: KafkaSettings, worker: WorkerSettings, worker_id: str, clock: BrokerClock
    ) -> None:
        self._kafka = kafka
        self._worker = worker
        self._worker_id = worker_id
        self.clock = clock
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._last = 0.0
        self._was_acting: bool | None = None
        self.failures = 0

    def maybe_beat(self) -> None:
        """Start a heartbeat if the last one is older than the interval and none is out."""
        due = time.monotonic() - self._last >= self._worker.clock_probe_interval_s
        if due and (self._task is None or self._task.done()):
            self._last = time.monotonic()
            self._task = asyncio.ensure_future(self._beat())

    async def _beat(self) -> None:
        try:
            producer = await self._started()
            value = json.dumps(heartbeat_value(self._worker_id, self.clock)).encode()
            sent = time.time()
            meta = await producer.send_and_wait(
                self._kafka.topic_heartbeats, value, key=self._worker_id.encode()
            )
            acked = time.time()
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat: the clock goes stale
            self.failures += 1
            log.warning("heartbeat failed (%s): the clock is measured again next time", exc)
            self._say()
            return
        if meta.timestamp_type == LOG_APPEND_TIME and meta.timestamp is not None:
            self.clock.observe(Sample(sent, acked, meta.timestamp / 1000))
        else:
            log.error(
                "%s does not use broker timestamps (message.timestamp.type=LogAppendTime): "
                "this worker cannot measure its clock; hint: ledger topics create",
                self._kafka.topic_heartbeats,
            )
        self._say()

    def _say(self) -> None:
        """One log line when the worker stops or resumes acting on its clock."""
        acting = not self.clock.skewed
        if acting != self._was_acting:
            if acting:
                log.info(
                    "clock within %gs of the broker's (offset %+.3fs): acting",
                    self.clock.limit_s,
                    self.clock.offset_s,
                )
            else:
                log.warning("not acting: %s", self.clock.why_not())
            self._was_acting = acting

    async def _started(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self._kafka.bootstrap_servers,
                enable_idempotence=True,
                acks="all",
                linger_ms=0,
                request_timeout_ms=10_000,
                **client_options(self._kafka),
            )
            await producer.start()
            self._producer = producer
        return self._producer

    async def stop(self) -> None:
        """Stop the heartbeat's producer."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
