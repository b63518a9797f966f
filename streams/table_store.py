"""The faust table as the processor's StateStore: decoded states cached, writes held back.

Every get of a faust rocksdb table asks RocksDB twice (``__contains__``, then the value)
and decodes the JSON: a seventh of a worker's CPU in a backlog drain, most of it for keys
that were written a moment earlier. Gets hit a bounded cache of decoded states first.

Writes are held back until the next offset commit (write-back). A delivery's three events
(requested, claimed, settled) usually land within one commit interval, and only its last
state has to be in the changelog before the offsets of those events are committed: one
changelog record, one RocksDB write and one JSON encoding instead of three. The consumer
calls ``flush`` right before it hands the changelog writes to Kafka and commits
(streams/transport.py), so a committed offset never runs ahead of the states it covers;
until then a crash loses only states whose records are read again. Only this process
writes the table while it owns a partition, so the cache can only go stale when
ownership changes or a table is recovered: ``forget`` then (after a flush).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from faust.streams import current_event

from events.delivery_state import DeliveryState
from events.state_codec import dumps, loads

CACHED_STATES = 20_000  # bounded: a million open deliveries stay in RocksDB only


class TableStore:
    """The delivery table (values are state_codec bytes) behind a write-back cache."""

    def __init__(self, table: Any, cached: int = CACHED_STATES) -> None:
        self._table = table
        self._cached = cached
        self._states: dict[str, DeliveryState] = {}  # insertion order: oldest first
        # Put since the last flush: key -> (table partition, state); never evicted.
        self._held: dict[str, tuple[int, DeliveryState]] = {}
        self.puts = 0
        self.writes = 0

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``."""
        held = self._held.get(key)
        if held is not None:
            return held[1]
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
        self._held[key] = (event.message.partition, state)
        self.puts += 1

    def flush(self) -> int:
        """Write every held state to RocksDB and hand it to the changelog producer (faust's
        buffer, drained before the offset commit); returns how many were written."""
        if not self._held:
            return 0
        held, self._held = self._held, {}
        data = self._table.data  # faust has no public API to write outside an event
        for key, (partition, state) in held.items():
            value = dumps(state)
            raw_key = data._encode_key(key)
            data._db_for_partition(partition).put(raw_key, value)
            data._key_index[raw_key] = partition
            self._table.send_changelog(partition, key, value)
            self._states.pop(key, None)
            self._remember(key, state)
        self.writes += len(held)
        return len(held)

    def _remember(self, key: str, state: DeliveryState) -> None:
        self._states[key] = state  # states are frozen: sharing them is safe
        if len(self._states) > self._cached:
            del self._states[next(iter(self._states))]

    def forget(self) -> None:
        """Write what is held, then drop every cached state: partitions moved, or a table
        is being recovered."""
        self.flush()
        self._states.clear()

    @property
    def cached(self) -> int:
        """How many decoded states are held."""
        return len(self._states)

    def partition_states(self, partition: int) -> Iterator[DeliveryState]:
        """Every state stored for one partition, streamed (used to rebuild timers)."""
        self.flush()
        db = self._table.data._dbs.get(partition)  # faust has no public per-partition API
        if db is None:
            return
        offset_key = self._table.data.offset_key
        for key, value in db.items():
            if key != offset_key:
                yield loads(value)
