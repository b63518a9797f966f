"""Dead-letter records: what could not be decoded, why, and exactly where it came from."""

from __future__ import annotations

import base64
from datetime import datetime

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from events.base import utc_now


class DeadLetter(BaseModel):
    """One undecodable or invalid record, with the original bytes (base64) and position."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = "deadletter"
    reason: str
    original_topic: str
    original_partition: int
    original_offset: int
    original_key_b64: str | None
    original_value_b64: str | None
    detected_by: str
    occurred_at: AwareDatetime = Field(default_factory=utc_now)

    @classmethod
    def of(
        cls,
        *,
        reason: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        detected_by: str,
        occurred_at: datetime | None = None,
    ) -> DeadLetter:
        """Wrap a bad record for ``ledger.deadletter``."""
        return cls(
            reason=reason,
            original_topic=topic,
            original_partition=partition,
            original_offset=offset,
            original_key_b64=None if key is None else base64.b64encode(key).decode(),
            original_value_b64=None if value is None else base64.b64encode(value).decode(),
            detected_by=detected_by,
            occurred_at=occurred_at or utc_now(),
        )

    def original_value(self) -> bytes | None:
        """The bytes that failed to decode."""
        if self.original_value_b64 is None:
            return None
        return base64.b64decode(self.original_value_b64)
