"""The delivery-ledger vocabulary: events, keys, codec, settings and the publisher SDK."""

from events.base import Event
from events.codec import EventDecodeError, decode, encode
from events.deadletter import DeadLetter
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
from events.keys import canonical_json, idempotency_key, payload_hash
from events.publisher import DeliverySpec, Publisher, PublishFailed, PublishRejected
from events.settings import Settings

__all__ = [
    "DeadLetter",
    "DeliveryClaimed",
    "DeliveryConfirmed",
    "DeliveryEvent",
    "DeliveryFailed",
    "DeliveryNotSent",
    "DeliveryReconciled",
    "DeliveryRequested",
    "DeliveryRetryScheduled",
    "DeliverySent",
    "DeliverySpec",
    "DeliveryUnknown",
    "DuplicateDeliveryRequest",
    "Event",
    "EventDecodeError",
    "ExecutionEvent",
    "PublishFailed",
    "PublishRejected",
    "Publisher",
    "RunFailed",
    "RunMarkedUnknown",
    "RunStarted",
    "RunSucceeded",
    "Settings",
    "canonical_json",
    "decode",
    "encode",
    "idempotency_key",
    "payload_hash",
]
