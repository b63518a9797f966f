"""delivery-ledger's Kafka clients: the publisher SDK for agents (group commit), the
committed-log reader, Kafka security, outcome signing and its stored keys."""

from clients.publisher import DeliverySpec, Publisher, PublishFailed, PublishRejected

__all__ = ["DeliverySpec", "PublishFailed", "PublishRejected", "Publisher"]
