"""A rebuild in several processes: each worker reads, decodes, folds and writes a share of
the partitions; the main process prepares the database and merges their work.

Decoding (~25 us an event) and folding and writing (~20 us) are CPU-bound Python under one
GIL, so a sequential rebuild tops out near half of a raw read's speed (BENCHMARKS.md,
issue 12). Here every worker is a subprocess (``python -m projections.rebuild_worker``)
with a share of the partitions of both topics, balanced by record count.

Why the shares can be folded apart: every row of every table comes from ONE partition.
``agent_runs`` rows from the ``ledger.runs`` partition of their run id; ``deliveries``,
``delivery_attempts`` and ``duplicate_keys`` rows from the ``ledger.deliveries`` partition
of their idempotency key (a duplicate-key row is written by the delivery's own
``DuplicateDeliveryRequest``); ``skipped_records`` and ``projection_offsets`` rows are
per record and per partition. A run event folds only its run's row and a delivery event
only its delivery's rows (projections/fold.py), and the record key is checked against the
event (projections/records.py), so no table aggregates across partitions and nothing is
left for the main process to fold.

Each worker writes into its own stage (a SQLite file beside the target, or a schema of the
target PostgreSQL database), batch by batch as ``project`` does, so workers never wait on
each other's writer lock. When all have finished, the main process copies every stage into
the target in ONE transaction (rows and offsets together), builds the indexes in the final
durable commit, and drops the stages. A worker that fails or dies fails the rebuild with
one line; the target then holds only its empty schema (no rows, no offsets), never a
partial ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import signal
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from config.settings import Settings
from events.errors import LedgerError
from projections.backends import open_store
from projections.log import LogReader
from projections.stats import ProgressCallback, ProjectionStats
from projections.store import Offsets

Partition = tuple[str, int]


@dataclass(frozen=True)
class Job:
    """One worker's share: the stage to write, and each partition's end offset."""

    settings: Settings
    stage_dsn: str
    until: Offsets
    batch_size: int


def balance(counts: dict[Partition, int], workers: int) -> list[list[Partition]]:
    """Split the partitions with records into at most ``workers`` shares of about equal
    record count: the largest partition first, each to the least-loaded share so far
    (ties: the first share). Partitions without records are left out: nothing to read.
    Deterministic: the same counts always give the same shares."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    todo = sorted((p for p in counts if counts[p] > 0), key=lambda p: (-counts[p], p))
    shares: list[list[Partition]] = [[] for _ in range(min(workers, len(todo)))]
    loads = [0] * len(shares)
    for partition in todo:
        least = min(range(len(shares)), key=lambda i: loads[i])
        shares[least].append(partition)
        loads[least] += counts[partition]
    return [sorted(share) for share in shares]


def default_workers() -> int:
    """One worker process per CPU this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


async def plan(
    settings: Settings, until: Offsets | None, workers: int
) -> tuple[Offsets, list[list[Partition]]]:
    """The offsets to read every partition up to (the log's ends, or ``until``), and the
    workers' shares of the partitions."""
    async with LogReader(settings) as reader:
        await reader.start({})
        ends = await reader.end_offsets()
        limit = ends if until is None else {p: until.get(p, 0) for p in ends}
        # Offsets the log does not reach would be waited for forever.
        reader.check_within(until if until is not None else limit, ends)
    return limit, balance(limit, workers)


async def parallel_rebuild(
    settings: Settings,
    dsn: str,
    *,
    workers: int,
    replace: bool = False,
    until: Offsets | None = None,
    batch_size: int,
    progress: ProgressCallback | None = None,
) -> ProjectionStats | None:
    """``rebuild`` (projections/projector.py) with ``workers`` processes: the same tables,
    row for row. None when there is nothing to share (records in one partition or none):
    the tables are then prepared and empty, for a sequential rebuild to fill. Use
    ``rebuild(..., workers=N)``, which does that."""
    # The workers start first: their imports (~0.4 s each) overlap the preparing and planning.
    processes = [await _spawn(i) for i in range(workers)]
    store = open_store(dsn)
    names: list[str] = []
    try:
        # Prepared before the log is read, as a sequential rebuild does (the same errors);
        # dropped again if it fails.
        with store.rebuilding(replace=replace):
            store.start_bulk_load()
            limit, shares = await plan(settings, until, workers)
            # Those without a share (and, below, all of them) are told so: no job, stdin closed.
            await _reap(processes[len(shares) :] if len(shares) >= 2 else processes)
            if len(shares) < 2:
                # One partition with records (or none): nothing to share. The tables there
                # are the empty ones just prepared; the caller rebuilds them in one process.
                return None
            total = sum(limit.values())
            tag = uuid.uuid4().hex[:8]
            names = [f"rebuild_{tag}_w{i}" for i in range(len(shares))]
            jobs = [
                Job(settings, store.open_stage(name), {p: limit[p] for p in share}, batch_size)
                for name, share in zip(names, shares, strict=True)
            ]
            stats = await _run_workers(processes[: len(jobs)], jobs, total, progress)
            store.merge_stages(names)
            store.finish_bulk_load()
            return stats
    finally:
        await _reap(processes)
        for name in names:
            with contextlib.suppress(Exception):
                store.drop_stage(name)
        store.close()


async def _spawn(i: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "projections.rebuild_worker",
        f"--worker={i}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _reap(processes: Sequence[asyncio.subprocess.Process]) -> None:
    """Close the stdin of workers that got no job (they exit), kill any still running."""
    for process in processes:
        if process.returncode is None:
            if process.stdin is not None and not process.stdin.is_closing():
                process.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def _run_workers(
    processes: Sequence[asyncio.subprocess.Process],
    jobs: Sequence[Job],
    total: int,
    progress: ProgressCallback | None,
) -> ProjectionStats:
    """Give each started process its job, follow their progress, and sum their stats; the
    first worker to fail stops the others (``_reap``) and fails the rebuild."""
    done = [0] * len(jobs)

    def advanced(i: int, records: int) -> None:
        done[i] = records
        if progress is not None:
            progress(sum(done), total)

    followers = [
        asyncio.ensure_future(_follow(i, len(jobs), process, job, advanced))
        for i, (process, job) in enumerate(zip(processes, jobs, strict=True))
    ]
    try:
        results = await asyncio.gather(*followers)
    except BaseException:
        for follower in followers:
            follower.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        raise
    stats = ProjectionStats()
    for result in results:
        for name, value in asdict(result).items():
            setattr(stats, name, getattr(stats, name) + value)
    return stats


async def _follow(
    i: int,
    of: int,
    process: asyncio.subprocess.Process,
    job: Job,
    advanced: Any,
) -> ProjectionStats:
    assert process.stdin is not None
    assert process.stdout is not None
    who = f"rebuild worker {i + 1} of {of} ({len(job.until)} partitions, pid {process.pid})"
    try:
        process.stdin.write(pickle.dumps(job))
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it died at once: its exit status says how, below
    stats: ProjectionStats | None = None
    error: str | None = None
    async for line in process.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a line cut short by its death: the exit status tells
        if "records" in message:
            advanced(i, message["records"])
        elif "stats" in message:
            stats = ProjectionStats(**message["stats"])
        elif "error" in message:
            error = message["error"]
    code = await process.wait()
    if error is not None:
        raise LedgerError(
            f"{who} failed: {error}",
            "fix the cause, then rebuild again (a failed rebuild leaves no tables behind)",
        )
    if code != 0 or stats is None:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise LedgerError(
            f"{who} {how} before it finished: the rebuild is incomplete, nothing was merged",
            "rebuild again: ledger rebuild --into DSN (a failed rebuild leaves no tables behind)",
        )
    return stats
