"""API keys on ``ledger.api_keys`` (events/api_keys.py): issue, revoke, read, follow.

``issue_key`` makes a token (the secret leaves this function once, in the return value,
and only its hash is written), ``revoke_key`` appends the revocation, ``read_keys`` reads
the topic once to its end (the CLI), and ``ApiKeyTable`` reads it from the beginning and
then follows it in the background (the API server), the way the endpoint registry is
followed (clients/endpoint_registry.py), so a key issued or revoked applies without a
restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets

from aiokafka import AIOKafkaProducer, TopicPartition

from clients.committed_log import TRANSIENT, CommittedLog
from clients.kafka_security import client_options, start_producer
from config.parts import KafkaSettings
from events.api_keys import (
    ApiKey,
    ApiKeyDecodeError,
    ApiKeyEvent,
    ApiKeyIssued,
    ApiKeyRevoked,
    decode_api_key_event,
    fold,
    secret_digest,
    split_token,
)
from events.base import utc_now
from events.codec import encode
from events.errors import LedgerError

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0


def new_token() -> tuple[str, str, str]:
    """(key id, secret, token) for a new key: 64 random bits of id, 256 of secret."""
    key_id = secrets.token_hex(8)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    return key_id, secret, f"dlk_{key_id}_{secret}"


async def append_key_event(kafka: KafkaSettings, event: ApiKeyEvent) -> None:
    """Write ``event`` to ``ledger.api_keys`` and wait until the broker has it."""
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        **client_options(kafka),
    )
    await start_producer(producer, kafka)
    try:
        await producer.send_and_wait(
            kafka.topic_api_keys, encode(event), key=event.key_id.encode("ascii")
        )
    finally:
        await producer.stop()


async def issue_key(kafka: KafkaSettings, agent: str, issued_by: str) -> tuple[ApiKey, str]:
    """Issue a key for ``agent``: (the key as logged, the token to hand over once)."""
    key_id, secret, token = new_token()
    key = ApiKey(
        key_id=key_id,
        agent=agent,
        secret_sha256=secret_digest(secret),
        issued_at=utc_now(),
        issued_by=issued_by,
    )
    await append_key_event(kafka, ApiKeyIssued(key=key, producer=issued_by))
    return key, token


async def revoke_key(kafka: KafkaSettings, key_id: str, revoked_by: str) -> ApiKey:
    """Revoke key ``key_id`` (``LedgerError`` if there is no such key); a key already
    revoked stays as it was."""
    keys = await read_keys(kafka)
    current = keys.get(key_id)
    if current is None:
        raise LedgerError(f"no API key {key_id}", "'ledger api-keys list' shows the keys")
    if current.revoked_at is not None:
        return current
    revoked = ApiKey.model_validate(
        {**current.model_dump(), "revoked_at": utc_now(), "revoked_by": revoked_by}
    )
    await append_key_event(kafka, ApiKeyRevoked(key=revoked, producer=revoked_by))
    return revoked


async def read_keys(kafka: KafkaSettings, timeout_s: float = READ_TIMEOUT_S) -> dict[str, ApiKey]:
    """Every key now in the topic, by id (bad records skipped, logged)."""
    table: dict[str, ApiKey] = {}
    async with CommittedLog(kafka) as reader:
        partitions = await reader.partitions(kafka.topic_api_keys, missing_ok=True)
        if not partitions:
            return table
        ends = await reader.ends(partitions)
        reader.assign(partitions, dict.fromkeys(partitions, 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for tp in partitions:
            while await reader.position(tp) < ends[tp]:
                if loop.time() > deadline:
                    raise LedgerError(
                        f"could not read {kafka.topic_api_keys} to its end in {timeout_s:.0f}s",
                        "check the broker ('ledger broker logs')",
                    )
                for record in (await reader.read(500, 1000)).get(tp, []):
                    event = _decoded(record)
                    if event is not None:
                        table[event.key_id] = fold(table.get(event.key_id), event)
    return table


def _decoded(record: object) -> ApiKeyIssued | ApiKeyRevoked | None:
    try:
        return decode_api_key_event(getattr(record, "value", None))
    except ApiKeyDecodeError as exc:
        log.warning(
            "skipped %s[%s]@%s: %s",
            getattr(record, "topic", "?"),
            getattr(record, "partition", "?"),
            getattr(record, "offset", "?"),
            exc,
        )
        return None


class ApiKeyTable:
    """The keys, followed in the background: ``keys`` is always the latest table this
    process has read; ``caught_up`` is set once it read to the end it found at start."""

    def __init__(self, kafka: KafkaSettings, poll_s: float = 0.2) -> None:
        self._kafka = kafka
        self._poll_ms = int(poll_s * 1000)
        self.keys: dict[str, ApiKey] = {}
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    def apply(self, event: ApiKeyEvent) -> None:
        """Fold one event in."""
        self.keys = {**self.keys, event.key_id: fold(self.keys.get(event.key_id), event)}

    def agent_of(self, token: str) -> ApiKey | None:
        """The live key ``token`` proves, or None (malformed, unknown, wrong secret or
        revoked: the caller cannot tell which, by design)."""
        parts = split_token(token)
        if parts is None:
            return None
        key = self.keys.get(parts[0])
        return key if key is not None and key.accepts(parts[1]) else None

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
        """Read from the beginning, then every new record; survives a broker that goes
        away (logged, tried again) and a topic that does not exist yet (no keys)."""
        reader = CommittedLog(self._kafka)
        tp = TopicPartition(self._kafka.topic_api_keys, 0)
        assigned = False
        end = 0
        while True:
            try:
                if not reader.started:
                    await reader.start()
                if not assigned:
                    if not await reader.partitions(tp.topic, missing_ok=True):
                        if not self._warned:
                            self._warned = True
                            log.warning(
                                "no topic %s: no API key is accepted (create it with "
                                "'ledger topics create')",
                                tp.topic,
                            )
                        self.caught_up.set()
                        await asyncio.sleep(5)
                        continue
                    reader.assign([tp], {tp: 0})
                    end = (await reader.ends([tp]))[tp]
                    assigned = True
                    if end == 0:
                        self.caught_up.set()
                for record in (await reader.read(self._poll_ms, 1000)).get(tp, []):
                    event = _decoded(record)
                    if event is not None:
                        self.apply(event)
                if not self.caught_up.is_set() and await reader.position(tp) >= end:
                    self.caught_up.set()
            except asyncio.CancelledError:
                await reader.stop()
                raise
            except TRANSIENT as exc:
                log.warning("reading %s: %s (trying again)", tp.topic, exc)
                await reader.stop()
                reader = CommittedLog(self._kafka)
                assigned = False
                await asyncio.sleep(1)
