"""The faust table as the processor's StateStore: decoded states cached, writes held back.

Every get of a faust rocksdb table asks RocksDB twice (``__contains__``, then the value)
and decodes the JSON: a seventh of a worker's CPU in a backlog drain, most of it for keys
that were written a moment earlier. Gets hit a bounded cache of decoded states first.

Writes are held back until the next offset commit (write-back), in a ``StateTransaction``
(streams/state_transaction.py). A delivery's three events (requested, claimed, settled)
usually land within one commit interval, and only its last state has to be in the
changelog before the offsets of those events are committed: one changelog record, one
RocksDB write and one JSON encoding instead of three. The consumer calls
``before_commit`` right before it hands the changelog writes to Kafka and commits, and
``after_commit`` once the offsets are committed (streams/transport.py), so a committed
offset never runs ahead of the states it covers; until then a crash loses only states
whose records are read again. Only this process writes the table while it owns a
partition, so the cache can only go stale when ownership changes or a table is
recovered: ``forget`` then (after a flush).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from faust.streams import current_event

from events.delivery_state import DeliveryState
from events.state_codec import loads
from streams.faust_internals import table_partition_values
from streams.state_transaction import StateTransaction

CACHED_STATES = 20_000  # bounded: a million open deliveries stay in RocksDB only


class TableStore:
    """The delivery table (values are state_codec bytes) behind a write-back cache."""

    def __init__(self, table: Any, cached: int = CACHED_STATES) -> None:
        self._table = table
        self._cached = cached
        self._states: dict[str, DeliveryState] = {}  # insertion order: oldest first
        # The states put since the last flush (PREPARED); never evicted.
        self._open = StateTransaction(table)
        # Flushed, waiting for an offset commit; and those the commit under way covers.
        self._flushed: list[StateTransaction] = []
        self._committing: list[StateTransaction] = []
        self.puts = 0
        self.writes = 0

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``."""
        state = self._open.get(key)
        if state is not None:
            return state
        state = self._states.get(key)
        if state is not None:
            return state
        raw = self._table.get(key)
        if raw is None:
            return None
        state = loads(raw)
        self._remember(key, state)
        return state

    def put(self, key: str, state: DeliveryState) -> None:
        """Replace the state of ``key``; written to the table and its changelog by the
        next ``flush``. Only inside the agent: the record's partition is the table's."""
        event = current_event()
        if event is None:
            raise RuntimeError("the delivery table is written only by the delivery agent")
        self._open.put(key, event.message.partition, state)
        self.puts += 1

    def flush(self) -> int:
        """Write every held state to RocksDB and hand it to the changelog producer (faust's
        buffer, drained before the offset commit); returns how many were written."""
        if not len(self._open):
            return 0
        transaction, self._open = self._open, StateTransaction(self._table)
        written = transaction.flush()
        for key, state in transaction.states():
            self._states.pop(key, None)
            self._remember(key, state)
        self._flushed.append(transaction)
        self.writes += written
        return written

    def before_commit(self) -> int:
        """Right before an offset commit flushes the producer: flush, and let that commit
        cover every transaction flushed so far."""
        written = self.flush()
        self._committing.extend(self._flushed)
        self._flushed.clear()
        return written

    def after_commit(self, committed: bool) -> None:
        """The offset commit after ``before_commit`` ended; if it committed nothing, the
        next one covers its transactions."""
        covered, self._committing = self._committing, []
        if not committed:
            self._flushed[:0] = covered
            return
        for transaction in covered:
            transaction.commit()

    def _remember(self, key: str, state: DeliveryState) -> None:
        self._states[key] = state  # states are frozen: sharing them is safe
        if len(self._states) > self._cached:
            del self._states[next(iter(self._states))]

    def forget(self) -> None:
        """Write what is held, then drop every cached state: partitions moved, or a table
        is being recovered. Flushed transactions no commit covers yet stay FLUSHED: their
        states are in the changelog, and whether this worker commits their offsets is not
        known any more."""
        self.flush()
        self._flushed.clear()
        self._states.clear()

    @property
    def cached(self) -> int:
        """How many decoded states are held."""
        return len(self._states)

    def partition_states(self, partition: int) -> Iterator[DeliveryState]:
        """Every state stored for one partition, streamed (used to rebuild timers)."""
        self.flush()
        for value in table_partition_values(self._table, partition):
            yield loads(value)
