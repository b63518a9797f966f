"""The closed set of events, as discriminated unions on ``type``."""

from __future__ import annotations

from typing import Annotated

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
)
AnyEvent = Annotated[AnyExecutionEvent | AnyDeliveryEvent, Field(discriminator="type")]

ALL_EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        RunSucceeded,
        RunFailed,
        RunMarkedUnknown,
        DeliveryRequested,
        DeliveryClaimed,
        DeliverySent,
        DeliveryConfirmed,
        DeliveryNotSent,
        DeliveryUnknown,
        DeliveryReconciled,
        DeliveryRetryScheduled,
        DeliveryFailed,
        DuplicateDeliveryRequest,
    )
}

EVENT_ADAPTER: TypeAdapter[AnyExecutionEvent | AnyDeliveryEvent] = TypeAdapter(AnyEvent)
