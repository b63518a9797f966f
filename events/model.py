"""The closed set of events, as discriminated unions on ``type``."""

from __future__ import annotations

from typing import Annotated, get_args

from pydantic import Field, TypeAdapter

from events.base import Event
from events.delivery import (
    DeliveryClaimed,
    DeliveryConfirmed,
    DeliveryEvent,
    DeliveryFailed,
    DeliveryNotSent,
    DeliveryReconciled,
    DeliveryRequested,
    DeliveryRetryScheduled,
    DeliverySent,
    DeliveryUnknown,
    DuplicateDeliveryRequest,
)
from events.execution import (
    ExecutionEvent,
    RunFailed,
    RunMarkedUnknown,
    RunStarted,
    RunSucceeded,
)
from events.operator import DeliveryRedriveRequested, DeliveryResolved
from events.waiting import DeliveryHeld

__all__ = [
    "ALL_EVENT_TYPES",
    "AnyDeliveryEvent",
    "AnyEvent",
    "AnyExecutionEvent",
    "DeliveryEvent",
    "Event",
    "ExecutionEvent",
]

AnyExecutionEvent = RunStarted | RunSucceeded | RunFailed | RunMarkedUnknown
AnyDeliveryEvent = (
    DeliveryRequested
    | DeliveryClaimed
    | DeliverySent
    | DeliveryConfirmed
    | DeliveryNotSent
    | DeliveryUnknown
    | DeliveryReconciled
    | DeliveryRetryScheduled
    | DeliveryFailed
    | DuplicateDeliveryRequest
    | DeliveryResolved
    | DeliveryRedriveRequested
    | DeliveryHeld
)
AnyEvent = Annotated[AnyExecutionEvent | AnyDeliveryEvent, Field(discriminator="type")]

# Written once, above: the unions are the closed set; this maps each ``type`` to its class.
ALL_EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls for cls in (*get_args(AnyExecutionEvent), *get_args(AnyDeliveryEvent))
}

EVENT_ADAPTER: TypeAdapter[AnyExecutionEvent | AnyDeliveryEvent] = TypeAdapter(AnyEvent)
