"""API keys on ``ledger.api_keys`` (events/api_keys.py): issue, revoke, read, follow.

``issue_key`` makes a token (the secret leaves this function once, in the return value,
and only its hash is written), ``revoke_key`` appends the revocation, ``read_keys`` reads
the topic once to its end (the CLI), and ``ApiKeyTable`` reads it from the beginning and
then follows it in the background (the API server), the way the endpoint registry is
followed (clients/endpoint_registry.py), so a key issued or revoked applies without a
restart.
"""

from __future__ import annotations

import base64
import logging
import secrets
from typing import Any

from clients.kafka_security import append_one
from clients.topic_follower import READ_TIMEOUT_S, TopicFollower, read_to_end
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


def new_token() -> tuple[str, str, str]:
    """(key id, secret, token) for a new key: 64 random bits of id, 256 of secret."""
    key_id = secrets.token_hex(8)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    return key_id, secret, f"dlk_{key_id}_{secret}"


async def append_key_event(kafka: KafkaSettings, event: ApiKeyEvent) -> None:
    """Write ``event`` to ``ledger.api_keys`` and wait until the broker has it."""
    await append_one(kafka, kafka.topic_api_keys, encode(event), event.key_id.encode("ascii"))


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
    """Every key now in the topic, by id (bad records skipped, logged; none without it)."""
    table: dict[str, ApiKey] = {}

    def take(record: Any) -> None:
        event = _decoded(record)
        if event is not None:
            table[event.key_id] = fold(table.get(event.key_id), event)

    await read_to_end(kafka, kafka.topic_api_keys, take, missing_ok=True, timeout_s=timeout_s)
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


class ApiKeyTable(TopicFollower):
    """The keys, followed in the background: ``keys`` is always the latest table this
    process has read; ``caught_up`` is set once it read to the end it found at start."""

    def __init__(self, kafka: KafkaSettings, poll_s: float = 0.2) -> None:
        super().__init__(
            kafka, kafka.topic_api_keys, missing="no API key is accepted", poll_s=poll_s
        )
        self.keys: dict[str, ApiKey] = {}

    def take(self, record: Any) -> None:
        """One record: folded in, or skipped (logged)."""
        event = _decoded(record)
        if event is not None:
            self.apply(event)

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
