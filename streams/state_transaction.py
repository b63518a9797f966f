"""The delivery states put between two offset commits, as one transaction with a status.

The fold puts a delivery's state once per event; only the last state of each key before
an offset commit has to be in the table and its changelog when the offsets of those
events are committed. A ``StateTransaction`` holds those states (PREPARED), writes each
once to RocksDB and hands it to the changelog producer (FLUSHED: faust's producer drains
it before the offsets are committed, streams/transport.py) and learns that the offsets
covering it are committed (COMMITTED). A flush that raises leaves it FAILED. Every other
step raises ``TransactionStatusError``: a state put after the flush would be committed
past without ever being written. (quix-streams' ``PartitionTransaction`` is the model.)
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from events.delivery_state import DeliveryState
from events.state_codec import dumps
from streams.faust_internals import write_table_value


class TransactionStatus(StrEnum):
    """Where a transaction's states are."""

    PREPARED = "prepared"  # held in memory only; states may be put
    FLUSHED = "flushed"  # in RocksDB, and handed to the changelog producer
    COMMITTED = "committed"  # the offsets of the records they fold are committed
    FAILED = "failed"  # the flush raised: some states may be written, some not


class TransactionStatusError(RuntimeError):
    """A step the transaction's status does not allow."""


class StateTransaction:
    """The states put into one faust table since the last flush, until they are committed."""

    def __init__(self, table: Any) -> None:
        self._table = table
        self._held: dict[str, tuple[int, DeliveryState]] = {}  # key -> (partition, state)
        self._status = TransactionStatus.PREPARED

    @property
    def status(self) -> TransactionStatus:
        """Where the states are; only the steps below change it."""
        return self._status

    def _require(self, status: TransactionStatus, step: str) -> None:
        if self._status is not status:
            raise TransactionStatusError(
                f"cannot {step} a {self._status} state transaction (only a {status} one)"
            )

    def put(self, key: str, partition: int, state: DeliveryState) -> None:
        """Hold ``state`` as the state of ``key`` (in table partition ``partition``),
        replacing one held before."""
        self._require(TransactionStatus.PREPARED, "put into")
        self._held[key] = (partition, state)

    def get(self, key: str) -> DeliveryState | None:
        """The state held for ``key``, if one is."""
        held = self._held.get(key)
        return None if held is None else held[1]

    def __len__(self) -> int:
        return len(self._held)

    def states(self) -> Iterator[tuple[str, DeliveryState]]:
        """Every held key and state, in the order first put."""
        for key, (_, state) in self._held.items():
            yield key, state

    def flush(self) -> int:
        """Write every held state to the table's store and hand it to its changelog
        producer; returns how many were written."""
        self._require(TransactionStatus.PREPARED, "flush")
        try:
            for key, (partition, state) in self._held.items():
                value = dumps(state)
                write_table_value(self._table, partition, key, value)
                self._table.send_changelog(partition, key, value)
        except BaseException:
            self._status = TransactionStatus.FAILED
            raise
        self._status = TransactionStatus.FLUSHED
        return len(self._held)

    def commit(self) -> None:
        """The offsets covering these states are committed."""
        self._require(TransactionStatus.FLUSHED, "commit")
        self._status = TransactionStatus.COMMITTED
