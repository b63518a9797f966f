"""How large a Kafka record is, against the one limit every writer of the ledger keeps.

The producer refuses a record whose batch would pass its ``max_request_size`` (aiokafka's
default and ours: 1 MB), and the broker's ``message.max.bytes`` is about the same. The
publisher refuses such a run before anything is written; the worker refuses such a
fanned-out request (streams/fan_out.py) instead of failing its producer.
"""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from events.codec import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # the readers' limit too


def record_size(key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None) -> int:
    """The bytes a batch of this one record takes, as the producer counts them."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers or []))
