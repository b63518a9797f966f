"""API keys as events: the compacted ``ledger.api_keys`` topic, keyed by key id.

An API key lets an agent publish over the HTTP ingest API (api/). Its secret is never in
the log: ``ApiKeyIssued`` carries the SHA-256 of it. A slow password hash (argon2,
bcrypt) guards secrets people choose; these are 256 random bits, so no guess list exists
to run through a fast hash, and SHA-256 lets every request be checked in microseconds.

A key names the agent it speaks for (``agent``): the ``producer`` of the events published
with it, which is what budgets (events/budgets.py) count and traces name. An agent may
have several keys (rotation: issue the new one, move the callers, revoke the old one).

The topic is compacted by key id, so only the latest record of a key is sure to survive:
``ApiKeyRevoked`` therefore carries the whole key too, and the fold keeps a revocation
once seen (a re-read or a stale issue record never brings a revoked key back).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from events.base import Event
from events.bounds import Moment

KEY_ID = re.compile(r"^[0-9a-f]{16}$")
# The token an agent sends: ``dlk_<key id>_<secret>``, the secret 43 url-safe base64
# characters (32 random bytes). The key id finds the key; the secret proves it.
TOKEN = re.compile(r"^dlk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
FROZEN = ConfigDict(frozen=True, extra="forbid")


class ApiKey(BaseModel):
    """One key as the log knows it: who it speaks for, the hash of its secret, and
    whether it was revoked."""

    model_config = FROZEN

    key_id: str = Field(pattern=KEY_ID.pattern)
    agent: str = Field(min_length=1, max_length=200)
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    issued_at: Moment
    issued_by: str = Field(min_length=1, max_length=200)
    revoked_at: Moment | None = None
    revoked_by: str | None = Field(default=None, max_length=200)

    def accepts(self, secret: str) -> bool:
        """Whether ``secret`` is this key's (constant time), and the key is not revoked."""
        digest = secret_digest(secret)
        return self.revoked_at is None and hmac.compare_digest(digest, self.secret_sha256)


class ApiKeyEvent(Event):
    """An event of ``ledger.api_keys``, keyed by key id, carrying the whole key after it."""

    key: ApiKey

    @property
    def key_id(self) -> str:
        """The record key."""
        return self.key.key_id


class ApiKeyIssued(ApiKeyEvent):
    """A key was issued (its secret was shown once, to whoever issued it)."""

    TYPE: ClassVar[str] = "api_key.issued"
    type: Literal["api_key.issued"] = "api_key.issued"


class ApiKeyRevoked(ApiKeyEvent):
    """A key was revoked: requests with it are refused from now on."""

    TYPE: ClassVar[str] = "api_key.revoked"
    type: Literal["api_key.revoked"] = "api_key.revoked"


AnyApiKeyEvent = Annotated[ApiKeyIssued | ApiKeyRevoked, Field(discriminator="type")]
API_KEY_EVENT: TypeAdapter[ApiKeyIssued | ApiKeyRevoked] = TypeAdapter(AnyApiKeyEvent)


class ApiKeyDecodeError(ValueError):
    """A record of ``ledger.api_keys`` that is not an API key event."""


def decode_api_key_event(data: bytes | None) -> ApiKeyIssued | ApiKeyRevoked:
    """One record value validated, or ``ApiKeyDecodeError`` in one line."""
    if data is None:
        raise ApiKeyDecodeError("a tombstone (no value)")
    try:
        return API_KEY_EVENT.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ApiKeyDecodeError(f"not an API key event: {where}: {first['msg']}") from None


def fold(current: ApiKey | None, event: ApiKeyEvent) -> ApiKey:
    """The key after ``event``: a revocation is final; a key is issued once."""
    if current is not None and current.revoked_at is not None:
        return current
    if isinstance(event, ApiKeyIssued) and current is not None:
        return current  # a re-read: the first issue stands
    return event.key


def secret_digest(secret: str) -> str:
    """The hex SHA-256 of a key's secret, as the log stores it."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed token, else None."""
    found = TOKEN.match(token)
    return (found.group(1), found.group(2)) if found else None
