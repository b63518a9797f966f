"""Bounds on every field of every event, so that no fold or decision can overflow.

Checked at decode (a record outside them is refused with the field's name) and in the SDK
(before anything is written). The window of times is fixed, not read from a clock, so a
rebuild next year refuses exactly what the live readers refused today; producer-set times
are also held to the publisher's own clock (``check_not_ahead``), where a clock is.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, Field

# Every time an event carries lies in this window: far from datetime's limits, so adding
# any bounded duration (an SLO, a lease, a backoff) to it cannot overflow.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
# Counters and fencing tokens: 62 bits, so that any +1 or sum of a few of them still fits a
# signed 64-bit column (SQLite INTEGER, PostgreSQL BIGINT).
MAX_COUNTER = 2**62
# The longest SLO a delivery may declare (a year): sooner is an SLO, later is no SLO.
MAX_SLO_SECONDS = 366 * 24 * 3600
# Short identifiers (provider ids and statuses), and longer texts (evidence, reasons).
MAX_ID_CHARS = 1000
MAX_TEXT_CHARS = 4000
MAX_RECIPIENT_CHARS = 4096
# Deliveries one run record may carry (a record is at most 1 MB: each entry takes more
# than 100 bytes).
MAX_RUN_DELIVERIES = 10_000


def within_window(value: datetime) -> datetime:
    """A time between ``EARLIEST`` and ``LATEST``, or a ``ValueError`` saying so."""
    if not EARLIEST <= value < LATEST:
        raise ValueError(
            f"time {value.isoformat()} is outside {EARLIEST.year}-{LATEST.year} (events/bounds.py)"
        )
    return value


def check_not_ahead(value: datetime, now: datetime, skew_s: float, field: str) -> None:
    """Refuse a producer-set time further ahead of ``now`` than the allowed clock skew."""
    if value - now > timedelta(seconds=skew_s):
        raise ValueError(
            f"{field} {value.isoformat()} is {(value - now).total_seconds():.0f}s ahead of this "
            f"clock; at most {skew_s:g}s of clock skew is allowed"
        )


Moment = Annotated[AwareDatetime, AfterValidator(within_window)]
Counter = Annotated[int, Field(ge=0, le=MAX_COUNTER)]
Ordinal = Annotated[int, Field(ge=1, le=MAX_COUNTER)]


def check_json_values(value: Any) -> str | None:
    """Why a parsed JSON document holds something no event may carry (a non-finite number,
    a string with a lone surrogate, which no UTF-8 writer can encode), or None. Iterative:
    no recursion limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return "a string holds a lone surrogate (not encodable as UTF-8)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"a number is {item} (JSON has no NaN or Infinity)"
        elif isinstance(item, dict):
            for name, child in item.items():
                stack.append(name)
                stack.append(child)
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
