"""The projector: read the log in batches and commit each batch with its offsets.

``project`` runs until stopped (``ledger project``) or until given offsets are reached
(``ledger rebuild``, ``ledger verify``). It starts from the offsets stored in the
database, so a restart after any crash resumes exactly after the last committed batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from config.settings import Settings
from events.outage import Outage, OutageTooLong
from projections.backends import open_store
from projections.deadletters import ProjectorDeadLetters
from projections.fold import Batch, Position
from projections.log import LogReader
from projections.parallel_rebuild import parallel_rebuild
from projections.records import LogRecord
from projections.stats import ProgressCallback as ProgressCallback
from projections.stats import ProjectionStats as ProjectionStats
from projections.store import BatchUnwritable, Offsets, RecordRefused, Store

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 5000

# Called with every batch of records read, in log order, before it is written.
RecordObserver = Callable[[Sequence[LogRecord]], None]


async def project(
    settings: Settings,
    store: Store,
    *,
    stop: asyncio.Event | None = None,
    until: Offsets | Literal["end"] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressCallback | None = None,
    observe: RecordObserver | None = None,
    dead_letters: ProjectorDeadLetters | None = None,
    write_in_thread: bool = True,
    partitions: Collection[tuple[str, int]] | None = None,
    outage: Outage | None = None,
) -> ProjectionStats:
    """Fold the log into ``store`` from its stored offsets.

    Runs until ``stop`` is set, or, with ``until``, until every partition is read up
    to those offsets (``"end"``: the last stable offsets when it starts). ``observe``
    sees every record read, so a second fold can ride along on the same read. With
    ``dead_letters`` (the live projector), each batch's undecodable records of
    ``ledger.runs``, ``ledger.endpoints`` and ``ledger.budgets`` (no worker dead-letters
    those: projections/deadletters.py) are dead-lettered before the batch that skips them
    commits. Without
    ``write_in_thread``, each batch is written in the event loop's thread, before the
    next one is read (see ``rebuild``). With ``partitions``, only those are read (a
    parallel rebuild's worker: projections/rebuild_worker.py). With ``outage`` (the live
    projector), a failure of the database itself (``Store.system_errors``: a restart, a
    dropped connection) does not end it: the batch is rolled back, the store reconnects
    with backoff, and reading resumes from the offsets the database holds, so no batch is
    lost or applied twice (``ride_out``).
    """
    stats = ProjectionStats()
    async with LogReader(settings, batch_size=batch_size) as reader:
        await reader.start(store.load_offsets(), partitions)
        ends = await reader.end_offsets()
        limit = ends if until == "end" else until
        if limit is not None:
            # Offsets the log does not reach would be waited for forever.
            reader.check_within(limit, ends)
        total = None
        if limit is not None:
            total = sum(
                max(0, limit.get(p, 0) - start) for p, start in reader.start_offsets.items()
            )
        # One batch is written (in a thread, if write_in_thread) while the next is fetched
        # and decoded: the batches still commit strictly one after another, in order.
        writing: asyncio.Future[Batch] | None = None
        try:
            while stop is None or not stop.is_set():
                if limit is not None and await reader.reached(limit):
                    break
                records = await reader.read(timeout_ms=500, until=limit)
                try:
                    if writing is not None:
                        done, writing = writing, None
                        _count(stats, await done, progress, total)
                    if records:
                        if observe is not None:
                            observe(records)
                        if dead_letters is not None:
                            stats.dead_lettered += await dead_letters.send(records)
                        stats.records += len(records)
                        write = _Writer(store, settings.faults, write_in_thread, dead_letters)
                        if write_in_thread:
                            writing = asyncio.ensure_future(write(records))
                        else:
                            _count(stats, await write(records), progress, total)
                except store.system_errors as exc:
                    if outage is None:
                        raise
                    # The failed batch was rolled back (or committed, if only the answer
                    # was lost): the database's offsets say which. The records read since
                    # are dropped too, and everything is read again from those offsets.
                    stored = await ride_out(store, outage, exc, stop)
                    if stored is None:
                        break  # stopped while waiting
                    reader.seek(stored)
        finally:
            if writing is not None:
                _count(stats, await writing, progress, total)
    return stats


# A bound on reconnection attempts in one outage, beside its time limit (Outage.limit_s).
MAX_RECONNECTS = 100_000


async def ride_out(
    store: Store, outage: Outage, exc: BaseException, stop: asyncio.Event | None
) -> Offsets | None:
    """Wait out the database's outage that raised ``exc``: reconnect with backoff until it
    answers, then return the offsets it holds (None if ``stop`` is set meanwhile). Raises
    ``LedgerError`` for a configuration error or an outage past ``outage.limit_s``."""
    delay = outage.failed(exc)
    for _ in range(MAX_RECONNECTS):
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                return None
        try:
            await asyncio.to_thread(store.reconnect)
            stored = await asyncio.to_thread(store.load_offsets)
        except store.system_errors as again:
            delay = outage.failed(again)
            continue
        outage.recovered()
        return stored
    raise OutageTooLong(
        f"{outage.what} still unreachable after {MAX_RECONNECTS} attempts",
        "check that it is running and reachable, then start again",
    )


@dataclass
class _Writer:
    """Writes one batch under the record guard (events/refusal.py): a record the fold or
    the database refuses is dead-lettered (live projector only), then skipped with its
    reason, and the batch is written again without it; a batch the database refuses as a
    whole is written record by record to find the record. Failures of the database
    itself (``Store.system_errors``) propagate."""

    store: Store
    faults: frozenset[str]
    in_thread: bool
    dead_letters: ProjectorDeadLetters | None

    async def __call__(
        self, records: Sequence[LogRecord], refused: dict[Position, str] | None = None
    ) -> Batch:
        refused = {} if refused is None else refused
        for _ in range(len(records) + 1):  # each round refuses one more record, or ends
            try:
                if self.in_thread:
                    return await asyncio.to_thread(
                        self.store.apply_records, records, self.faults, refused
                    )
                return self.store.apply_records(records, self.faults, refused)
            except RecordRefused as exc:
                log.warning("%s", exc.reason)
                refused[exc.record.position] = exc.reason
                if self.dead_letters is not None:
                    await self.dead_letters.refused(exc.record, exc.reason)
            except BatchUnwritable as exc:
                if len(records) <= 1:
                    raise  # not one record's fault after all: the database's own
                log.warning("a batch of %d records was refused (%s): one by one", len(records), exc)
                whole = Batch()
                for record in records:
                    one = await self([record], refused)
                    whole.applied += one.applied
                    whole.skipped += one.skipped
                return whole
        raise AssertionError("unreachable: every record refused and still no batch written")


def _count(
    stats: ProjectionStats, batch: Batch, progress: ProgressCallback | None, total: int | None
) -> None:
    stats.batches += 1
    stats.applied += batch.applied
    stats.skipped += len(batch.skipped)
    if progress is not None:
        progress(stats.records, total)


async def rebuild(
    settings: Settings,
    dsn: str,
    *,
    replace: bool = False,
    until: Offsets | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: ProgressCallback | None = None,
    observe: RecordObserver | None = None,
    workers: int = 1,
) -> ProjectionStats:
    """Replay both topics from offset 0 into an empty database (to the end, or ``until``).

    With ``workers`` > 1 (and no ``observe``, which must see every record in one process),
    that many processes share the partitions (projections/parallel_rebuild.py): the same
    tables, row for row.

    Into SQLite the batches are written in the event loop's thread, not beside the
    reading: both are CPU-bound under the GIL, so a writer thread overlapped little
    (SQLite's own steps) and cost more than it saved in GIL hand-offs (BENCHMARKS.md,
    issue 12). PostgreSQL runs the statements in its own process: there the thread stays.
    """
    if workers > 1 and observe is None:
        shared = await parallel_rebuild(
            settings,
            dsn,
            workers=workers,
            replace=replace,
            until=until,
            batch_size=batch_size,
            progress=progress,
        )
        if shared is not None:
            return shared
        replace = True  # nothing to share: its empty tables are rebuilt here, in one process
    store = open_store(dsn)
    try:
        with store.rebuilding(replace=replace):
            store.start_bulk_load()
            stats = await project(
                settings,
                store,
                until="end" if until is None else until,
                batch_size=batch_size,
                progress=progress,
                observe=observe,
                write_in_thread=store.rebuild_writes_in_thread,
            )
            store.finish_bulk_load()
        return stats
    finally:
        store.close()
