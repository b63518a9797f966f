"""delivery-ledger's Kafka clients: the publisher SDK for agents (group commit), the
committed-log reader, Kafka security, outcome signing and its stored keys.

``from clients import Publisher`` loads the SDK when asked for, not with every client
module: a worker or a CLI command that never publishes does not pay for it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clients.publisher import DeliverySpec, Publisher, PublishFailed, PublishRejected

__all__ = ["DeliverySpec", "PublishFailed", "PublishRejected", "Publisher"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("clients.publisher"), name)
    raise AttributeError(f"module 'clients' has no attribute {name!r}")
