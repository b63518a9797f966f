"""Appending signed events to one topic: the operator's actions and budgets share it.

An idempotent producer (acks from all in-sync replicas) that signs each record value with
the given signer (clients/outcome_signing.py), keys it, and returns once the broker has
every record of the call. ``async with SignedLog(...) as log: await log.append(events)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Generic, Self, TypeVar

from aiokafka import AIOKafkaProducer

from clients.kafka_security import client_options, start_producer
from clients.outcome_signing import OutcomeSigner
from config.settings import Settings

E = TypeVar("E")


class SignedLog(Generic[E]):
    """Signed, keyed appends to ``topic``."""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        signer: OutcomeSigner | None,
        encode: Callable[[E], bytes],
        key: Callable[[E], bytes],
    ) -> None:
        self._settings = settings
        self._topic = topic
        self._signer = signer
        self._encode = encode
        self._key = key
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Self:
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.kafka.bootstrap_servers,
            enable_idempotence=True,
            acks="all",
            **client_options(self._settings.kafka),
        )
        await start_producer(producer, self._settings.kafka)
        self._producer = producer
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def append(self, events: Sequence[E]) -> None:
        """Write ``events`` in order, each signed and keyed; return when every one is
        acknowledged."""
        assert self._producer is not None, f"use {type(self).__name__} as 'async with'"
        futures = []
        for event in events:
            value = self._encode(event)
            headers = None if self._signer is None else self._signer.headers(value)
            futures.append(
                await self._producer.send(self._topic, value, key=self._key(event), headers=headers)
            )
        await asyncio.gather(*futures)
