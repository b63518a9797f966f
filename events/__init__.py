"""The delivery-ledger vocabulary: events, keys, codec and the receiver contract.

Importable alone: pydantic, rfc8785 (payload hashes; pure Python, no dependencies) and the
standard library, nothing else (no Kafka, HTTP or crypto library;
tests/events/test_import_alone.py). The publisher SDK is in ``clients``,
the settings in ``config``."""

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
from events.keys import canonical_json, idempotency_key
from events.payload_hashes import payload_hash

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
    "DeliveryUnknown",
    "DuplicateDeliveryRequest",
    "Event",
    "EventDecodeError",
    "ExecutionEvent",
    "RunFailed",
    "RunMarkedUnknown",
    "RunStarted",
    "RunSucceeded",
    "canonical_json",
    "decode",
    "encode",
    "idempotency_key",
    "payload_hash",
]
