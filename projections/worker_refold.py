"""The log re-folded by the worker's rules (events/delivery_state.py), next to a projection.

``ledger verify`` compares a projection with a rebuild of itself; that cannot see a
projection that folds by other rules than the worker. So verify also folds the same
records with ``events.delivery_state.apply`` and reports every delivery whose projected
row says something else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from config.settings import Settings
from events.delivery import DeliveryEvent, DeliveryRequested
from events.delivery_state import DeliveryState, apply
from projections.log import LogReader
from projections.records import LogRecord
from projections.schema import DELIVERIES
from projections.store import Offsets

# The row's columns, and how each follows from the worker's state.
_DERIVED: tuple[tuple[str, str], ...] = (
    ("status", "status"),
    ("attempts", "attempt"),
    ("fencing_token", "fencing_token"),
    ("provider_message_id", "provider_message_id"),
    ("last_error_class", "last_error_class"),
    ("reconciliation", "reconciled"),
    ("settled_by", "settled_by"),
    ("redrives", "redrives"),
    ("waiting", "waiting"),
)


@dataclass
class WorkerFold:
    """Delivery states folded by the worker's rules, from records in log order."""

    states: dict[str, DeliveryState] = field(default_factory=dict)

    def __call__(self, records: Sequence[LogRecord]) -> None:
        """Fold a batch of records (a ``RecordObserver`` for ``project``)."""
        for record in records:
            event = record.event
            if not isinstance(event, DeliveryEvent):
                continue
            key = event.idempotency_key
            before = self.states.get(key)
            try:
                after = apply(before, event)
            except Exception:  # noqa: BLE001, S112 - the record guard: the worker refuses it too
                continue
            if after is None:
                continue
            if before is None and isinstance(event, DeliveryRequested):
                after = replace(after, payload=None)  # no rule reads it; keep memory small
            self.states[key] = after


@dataclass(frozen=True)
class RuleDifference:
    """A delivery whose projected row disagrees with the worker's fold of the same log."""

    idempotency_key: str
    run_id: str
    columns: tuple[tuple[str, Any, Any], ...]  # (column, projected, worker's rules)

    def line(self) -> str:
        """One printable line."""
        cols = "; ".join(f"{c}: projected={a!r} worker={b!r}" for c, a, b in self.columns)
        return f"delivery {self.idempotency_key} (run {self.run_id}): worker's rules differ: {cols}"


def expected_row(state: DeliveryState) -> dict[str, Any]:
    """The row columns the worker's state implies."""
    values = {column: getattr(state, attr) for column, attr in _DERIVED}
    values["status"] = state.status.public
    return values


def compare_rules(rows: Iterable[tuple[Any, ...]], fold: WorkerFold) -> list[RuleDifference]:
    """Every delivery (dumped ``deliveries`` rows) that differs from ``fold``, by key."""
    names = DELIVERIES.column_names
    projected = {row[0]: dict(zip(names, row, strict=True)) for row in rows}
    differences: list[RuleDifference] = []
    for key in sorted(projected.keys() | fold.states.keys()):
        row, state = projected.get(key), fold.states.get(key)
        columns: tuple[tuple[str, Any, Any], ...]
        if row is None or state is None:
            # A row the worker's fold has no state for, or the other way round.
            run_id = row["run_id"] if row is not None else getattr(state, "run_id", "")
            shown = None if state is None else state.status.public
            columns = (("row", None if row is None else row["status"], shown),)
            differences.append(RuleDifference(key, run_id, columns))
            continue
        expected = expected_row(state)
        columns = tuple((c, row[c], v) for c, v in expected.items() if row[c] != v)
        if columns:
            differences.append(RuleDifference(key, row["run_id"], columns))
    return differences


async def refold(settings: Settings, until: Offsets) -> WorkerFold:
    """Read the log from offset 0 up to ``until`` and fold it by the worker's rules."""
    fold = WorkerFold()
    async with LogReader(settings) as reader:
        await reader.start({})
        reader.check_within(until, await reader.end_offsets())
        while not await reader.reached(until):
            fold(await reader.read(timeout_ms=500, until=until))
    return fold
