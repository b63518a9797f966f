"""A faust transport whose worker consumer reads ``read_committed`` in at-least-once mode.

faust only reads committed records when ``processing_guarantee="exactly_once"``. We run
at-least-once (see streams/app.py for why) but must never act on records of a publisher
transaction that may still abort: a claim for a delivery whose run never committed would
send a notification for work that does not exist (failure matrix, row 1).
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka


class _ReadCommittedConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # aiokafka hands this to its fetcher in start(), which has not run yet.
        consumer._isolation_level = "read_committed"
        return consumer


class _ReadCommittedConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ReadCommittedConsumerThread(self, loop=self.loop, beacon=self.beacon)


class ReadCommittedTransport(faust_aiokafka.Transport):
    """aiokafka transport with the read_committed worker consumer."""

    Consumer = _ReadCommittedConsumer


class LedgerApp(faust.App):
    """faust.App using ReadCommittedTransport."""

    def _new_transport(self) -> Any:
        return ReadCommittedTransport(self.conf.broker_consumer, self, loop=self.loop)
