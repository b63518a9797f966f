"""``ledger verify``: a projection rebuilt from the log must equal the live one, row by row,
and every delivery row must say what the worker's rules say about the same log."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from config.settings import Settings
from projections.backends import open_store
from projections.database import Dump
from projections.projector import ProgressCallback, rebuild
from projections.schema import DELIVERIES, PROJECTION_OFFSETS, TABLES
from projections.store import Offsets
from projections.worker_refold import RuleDifference, WorkerFold, compare_rules, refold


@dataclass(frozen=True)
class Difference:
    """One row that is missing on a side, or differs in some columns."""

    table: str
    key: tuple[Any, ...]
    kind: str  # "only in live" | "only in rebuilt" | "differs"
    columns: tuple[tuple[str, Any, Any], ...] = ()  # (column, live, rebuilt)

    def line(self) -> str:
        """One printable line."""
        key = ", ".join(str(k) for k in self.key)
        if not self.columns:
            return f"{self.table} [{key}]: {self.kind}"
        cols = "; ".join(f"{c}: live={a!r} rebuilt={b!r}" for c, a, b in self.columns)
        return f"{self.table} [{key}]: {self.kind}: {cols}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of a comparison."""

    rows: int
    differences: list[Difference]
    # Deliveries whose live row differs from the worker's fold of the same log.
    rule_differences: list[RuleDifference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the projections are identical and agree with the worker's rules."""
        return not self.differences and not self.rule_differences


def compare(live: Dump, rebuilt: Dump) -> VerifyReport:
    """Compare two dumps table by table, keyed by primary key."""
    differences: list[Difference] = []
    rows = 0
    for table in TABLES:
        names = table.column_names
        key_at = [names.index(k) for k in table.key]
        left = {tuple(r[i] for i in key_at): r for r in live.get(table.name, [])}
        right = {tuple(r[i] for i in key_at): r for r in rebuilt.get(table.name, [])}
        rows += len(left)
        for key in sorted(left.keys() | right.keys()):
            a, b = left.get(key), right.get(key)
            if a is None:
                differences.append(Difference(table.name, key, "only in rebuilt"))
            elif b is None:
                differences.append(Difference(table.name, key, "only in live"))
            elif a != b:
                cols = tuple((n, x, y) for n, x, y in zip(names, a, b, strict=True) if x != y)
                differences.append(Difference(table.name, key, "differs", cols))
    return VerifyReport(rows, differences)


def offsets_of(dump: Dump) -> Offsets:
    """The offsets a dumped projection had consumed."""
    return {(topic, part): offset for topic, part, offset in dump[PROJECTION_OFFSETS.name]}


async def verify(
    settings: Settings,
    live_dsn: str,
    rebuilt_dsn: str | None = None,
    *,
    progress: ProgressCallback | None = None,
) -> VerifyReport:
    """Compare the live projection with a rebuilt one, and with the worker's rules.

    Without ``rebuilt_dsn``, rebuild into a temporary SQLite file up to exactly the
    offsets the live projection has consumed (read in the same snapshot as its rows),
    so a live projector that is still running or lagging compares like for like. The
    log is re-folded by the worker's rules up to the same offsets (on the rebuild's
    read, or on a read of its own when comparing with ``rebuilt_dsn``).
    """
    live = open_store(live_dsn)
    try:
        live.prepare("read")
        live_dump = live.dump()
    finally:
        live.close()
    if rebuilt_dsn is not None:
        other = open_store(rebuilt_dsn)
        try:
            other.prepare("read")
            report = compare(live_dump, other.dump())
        finally:
            other.close()
        fold = await refold(settings, offsets_of(live_dump))
        return _with_rules(report, live_dump, fold)
    fold = WorkerFold()
    with tempfile.TemporaryDirectory(prefix="ledger-verify-") as tmp:
        dsn = f"sqlite://{Path(tmp) / 'rebuilt.sqlite3'}"
        await rebuild(settings, dsn, until=offsets_of(live_dump), progress=progress, observe=fold)
        rebuilt = open_store(dsn)
        try:
            report = compare(live_dump, rebuilt.dump())
        finally:
            rebuilt.close()
    return _with_rules(report, live_dump, fold)


def _with_rules(report: VerifyReport, live: Dump, fold: WorkerFold) -> VerifyReport:
    return replace(report, rule_differences=compare_rules(live[DELIVERIES.name], fold))
