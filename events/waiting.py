"""Why a delivery waits: held back before its claim, never dropped, never an attempt.

An endpoint that is paused, disabled or whose circuit is open, and an agent over its send
budget, hold their deliveries in PENDING. The worker says so once per hold with
``DeliveryHeld`` (its reason, what it waits for), so the ledger and the dashboard count and
show what waits and why; the hold ends with the delivery's next claim, when the endpoint is
back or the budget allows. A held delivery makes no attempt: nothing is sent, nothing is
counted against its retry policy, and it is never FAILED for waiting.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Literal

from pydantic import Field

from events.bounds import MAX_TEXT_CHARS, Moment
from events.delivery import DeliveryEvent


class WaitReason(enum.StrEnum):
    """Why a PENDING delivery is held back."""

    PAUSED = "paused"  # an operator paused its endpoint
    DISABLED = "disabled"  # its endpoint is disabled (by an operator, or after a long outage)
    CIRCUIT_OPEN = "circuit_open"  # its endpoint's circuit breaker is open
    OVER_BUDGET = "over_budget"  # its agent has spent its send budget for the window


class DeliveryHeld(DeliveryEvent):
    """A PENDING delivery waits for ``reason`` (written by the worker when the hold begins or
    its reason changes); ``recheck_at`` is when the worker looks again, if it knows."""

    TYPE: ClassVar[str] = "delivery.held"
    type: Literal["delivery.held"] = "delivery.held"
    reason: WaitReason
    detail: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    recheck_at: Moment | None = None
