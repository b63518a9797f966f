"""The immutable event base: every event is frozen, typed by a stable name, and versioned."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import ClassVar
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field, field_validator

from events.bounds import Moment

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/@+=]{0,199}$")
KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


class Event(BaseModel):
    """Base of every event: frozen, no unknown fields, UTC timestamps.

    ``type`` is the stable wire name (never a Python path); ``schema_version`` is the
    version this class writes. Older versions are upcast on read (events/upcasting.py).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    TYPE: ClassVar[str]
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = 1
    event_id: UUID = Field(default_factory=uuid4)
    occurred_at: Moment = Field(default_factory=utc_now)
    producer: str = Field(min_length=1, max_length=200)

    @field_validator("occurred_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @field_validator("schema_version")
    @classmethod
    def _current_version(cls, value: int) -> int:
        if value != cls.SCHEMA_VERSION:
            raise ValueError(
                f"{cls.TYPE} is at schema_version {cls.SCHEMA_VERSION}, got {value} "
                "(older versions must be upcast before validation)"
            )
        return value


def check_run_id(value: str) -> str:
    """A run id is 1-200 safe characters with no ':' (the key's separator)."""
    if not RUN_ID_PATTERN.match(value):
        raise ValueError(
            "run_id must be 1-200 characters of letters, digits and ._-/@+= "
            f"(no ':' or spaces), got {value!r}"
        )
    return value


def check_key(value: str) -> str:
    """An idempotency key is 64 lowercase hex characters (a sha256)."""
    if not KEY_PATTERN.match(value):
        raise ValueError(f"idempotency_key must be 64 lowercase hex characters, got {value!r}")
    return value
