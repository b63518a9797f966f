"""The faust table as the processor's StateStore, with the recent states kept decoded.

Every get of a faust rocksdb table asks RocksDB twice (``__contains__``, then the value)
and decodes the JSON: a seventh of a worker's CPU in a backlog drain, most of it for keys
that were written a moment earlier. Writes go through a bounded cache of decoded states;
gets hit it first. Only this process writes the table while it owns a partition, so the
cache can only go stale when ownership changes or a table is recovered: ``forget`` then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from events.delivery_state import DeliveryState
from streams.state_codec import dumps, loads

CACHED_STATES = 20_000  # bounded: a million open deliveries stay in RocksDB only


class TableStore:
    """The delivery table (values are state_codec bytes) behind a write-through cache."""

    def __init__(self, table: Any, cached: int = CACHED_STATES) -> None:
        self._table = table
        self._cached = cached
        self._states: dict[str, DeliveryState] = {}  # insertion order: oldest first

    def get(self, key: str) -> DeliveryState | None:
        """The state of ``key``."""
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
        """Replace the state of ``key`` (inside the agent: goes to the changelog)."""
        self._table[key] = dumps(state)
        self._states.pop(key, None)
        self._remember(key, state)

    def _remember(self, key: str, state: DeliveryState) -> None:
        self._states[key] = state  # states are frozen: sharing them is safe
        if len(self._states) > self._cached:
            del self._states[next(iter(self._states))]

    def forget(self) -> None:
        """Drop every cached state: partitions moved, or a table is being recovered."""
        self._states.clear()

    @property
    def cached(self) -> int:
        """How many decoded states are held."""
        return len(self._states)

    def partition_states(self, partition: int) -> Iterator[DeliveryState]:
        """Every state stored for one partition, streamed (used to rebuild timers)."""
        db = self._table.data._dbs.get(partition)  # faust has no public per-partition API
        if db is None:
            return
        offset_key = self._table.data.offset_key
        for key, value in db.items():
            if key != offset_key:
                yield loads(value)
