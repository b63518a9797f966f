"""A local single-node KRaft Apache Kafka broker, run from jars fetched with Maven."""

from ledger.broker.process import BrokerStatus, LocalBroker

__all__ = ["BrokerStatus", "LocalBroker"]
