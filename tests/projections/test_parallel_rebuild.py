"""A parallel rebuild (projections/parallel_rebuild.py) ends with the very tables of a
sequential one, undecodable records and a rebuild to given offsets included, on both
backends; a worker that dies fails it and leaves no partial ledger. Real broker."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psycopg
import pytest

from config.settings import Settings, changed
from events import RunStarted
from events.errors import LedgerError
from projections.backends import open_store
from projections.log import LogReader
from projections.parallel_rebuild import balance
from projections.projector import ProjectionStats, rebuild
from projections.schema import TABLES
from projections.store import PROJECTOR_MID_BATCH, Offsets
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import P, at, fleet, incident_log, publish, snapshot
from tests.projections.test_cli import ledger

# Records no fold may apply: not JSON, JSON of no event, an event on the wrong topic.
UNDECODABLE = [b"\x00not json", b'{"type": "run.succeeded", "schema_version": 1}', b"{}"]


def test_balance_shares_partitions_by_record_count() -> None:
    counts = {("r", 0): 100, ("r", 1): 10, ("d", 0): 60, ("d", 1): 50, ("d", 2): 0, ("d", 3): 5}
    shares = balance(counts, 2)
    # Largest first, each to the lighter share: 100 | 60, then 50 (to 60), 10 (to 100),
    # and 5 to the first of two shares of 110.
    assert shares == [[("d", 3), ("r", 0), ("r", 1)], [("d", 0), ("d", 1)]]
    assert [sum(counts[p] for p in s) for s in shares] == [115, 110]
    # Every partition with records is in exactly one share; empty ones in none.
    for workers in (1, 2, 3, 4, 5, 8):
        got = balance(counts, workers)
        flat = [p for s in got for p in s]
        assert sorted(flat) == sorted(p for p, n in counts.items() if n > 0)
        assert len(got) == min(workers, 5)
        assert all(got)
    assert balance(counts, 3) == balance(dict(reversed(counts.items())), 3)
    assert balance({("r", 0): 0}, 4) == []
    with pytest.raises(ValueError, match="at least 1"):
        balance(counts, 0)


async def _log(settings: Settings) -> None:
    events = [*incident_log(), *fleet(60)]
    raw = [
        (settings.kafka.topic_runs, UNDECODABLE[0]),
        (settings.kafka.topic_deliveries, UNDECODABLE[1]),
    ]
    raw += [(settings.kafka.topic_runs, UNDECODABLE[2])]
    await publish(settings, events, raw)


async def _ends(settings: Settings) -> Offsets:
    async with LogReader(settings) as reader:
        await reader.start({})
        return await reader.end_offsets()


@pytest.mark.parametrize("dsn_factory", ["sqlite", "postgres"], indirect=True)
async def test_parallel_equals_sequential_undecodable_records_and_given_offsets(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    await _log(settings)
    sequential, parallel = dsn_factory(), dsn_factory()
    one = await rebuild(settings, sequential, workers=1)
    seen: list[tuple[int, int | None]] = []
    two = await rebuild(settings, parallel, workers=2, progress=lambda d, t: seen.append((d, t)))
    assert snapshot(parallel) == snapshot(sequential)
    assert one.skipped >= len(UNDECODABLE)
    assert (two.records, two.applied, two.skipped) == (one.records, one.applied, one.skipped)
    assert seen
    # The total counts offsets, as a sequential rebuild's does (transaction markers too).
    assert seen[-1] == (one.records, sum((await _ends(settings)).values()))
    skipped = snapshot(parallel)[1]["skipped_records"]
    assert len(skipped) == one.skipped

    # More workers than CPUs, and a rebuild to given offsets (about half of every partition).
    ends = await _ends(settings)
    until = {p: end // 2 for p, end in ends.items()}
    assert sum(until.values()) > 0
    sequential, parallel = dsn_factory(), dsn_factory()
    one = await rebuild(settings, sequential, until=until, workers=1)
    three = await rebuild(settings, parallel, until=until, workers=3)
    assert snapshot(parallel) == snapshot(sequential)
    assert (three.records, three.applied, three.skipped) == (one.records, one.applied, one.skipped)
    assert three.records < (await rebuild(settings, dsn_factory(), workers=3)).records

    # An observer must see every record in one process: the sequential path, whatever workers.
    observed: list[int] = []
    watched = dsn_factory()
    stats = await rebuild(
        settings, watched, until=until, workers=2, observe=lambda rs: observed.append(len(rs))
    )
    assert sum(observed) == stats.records == one.records
    assert snapshot(watched) == snapshot(sequential)


@pytest.mark.parametrize("dsn_factory", ["sqlite", "postgres"], indirect=True)
async def test_a_worker_killed_mid_batch_fails_the_rebuild_and_merges_nothing(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    await _log(settings)
    dsn = dsn_factory()
    dying = changed(settings, {"faults": frozenset({PROJECTOR_MID_BATCH})})
    with pytest.raises(LedgerError) as failed:
        await rebuild(dying, dsn, workers=2)
    line = failed.value.message
    assert "rebuild worker" in line
    assert "was killed by SIGKILL before it finished" in line
    assert "\n" not in line
    assert "rebuild again" in failed.value.hint
    # The target holds no ledger tables (none half-filled, none a `ledger project` would
    # mistake for a projection), and no stage is left behind.
    store = open_store(dsn)
    try:
        assert not {t.name for t in TABLES} & store.table_names()
    finally:
        store.close()
    _assert_no_stages(dsn)
    # Run again, without --replace: it completes and equals a sequential rebuild.
    await rebuild(settings, dsn, workers=2)
    reference = dsn_factory()
    await rebuild(settings, reference, workers=1)
    assert snapshot(dsn) == snapshot(reference)
    _assert_no_stages(dsn)


async def test_a_worker_killed_from_outside_fails_the_rebuild(
    settings: Settings, tmp_path: Path
) -> None:
    await publish(settings, fleet(300))
    dsn = f"sqlite://{tmp_path / 'killed.sqlite3'}"
    killed: list[int] = []
    before = _children(os.getpid())  # the test's own broker, if it started one

    def kill_one(done: int, total: int | None) -> None:
        if not killed:
            children = [c for c in _children(os.getpid()) if c not in before]
            assert len(children) == 2
            os.kill(children[-1], signal.SIGKILL)
            killed.append(children[-1])

    with pytest.raises(LedgerError, match="was killed by SIGKILL before it finished") as failed:
        await rebuild(settings, dsn, workers=2, batch_size=50, progress=kill_one)
    assert f"pid {killed[0]})" in failed.value.message
    store = open_store(dsn)
    try:
        assert not {t.name for t in TABLES} & store.table_names()
    finally:
        store.close()
    _assert_no_stages(dsn)
    assert _children(os.getpid()) == before  # the other worker is gone too


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return sorted(found)


def _assert_no_stages(dsn: str) -> None:
    if dsn.startswith("sqlite://"):
        path = Path(dsn.removeprefix("sqlite://"))
        assert not [p.name for p in path.parent.iterdir() if ".rebuild_" in p.name]
        return
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rebuild\\_%'"
        ).fetchall()
    assert found == []


async def test_ledger_rebuild_workers_from_the_command_line(
    settings: Settings, tmp_path: object
) -> None:
    await _log(settings)
    dsn = f"sqlite://{settings.data_dir / 'cli.sqlite3'}"
    built = ledger(settings, "rebuild", "--into", dsn, "--workers", "2")
    assert built.returncode == 0, built.stderr
    assert "skipped" in built.stdout
    reference = f"sqlite://{settings.data_dir / 'reference.sqlite3'}"
    stats: ProjectionStats = await rebuild(settings, reference, workers=1)
    assert f"{stats.applied} events applied, {stats.skipped} skipped" in built.stdout
    assert snapshot(dsn) == snapshot(reference)


async def test_nothing_to_share_falls_back_to_one_process(
    settings: Settings, tmp_path: Path
) -> None:
    # An empty log, then a log of one run (one partition with records): no second share.
    empty = f"sqlite://{tmp_path / 'empty.sqlite3'}"
    stats = await rebuild(settings, empty, workers=2)
    assert stats.records == 0
    assert snapshot(empty)[0] == {}
    await publish(settings, [RunStarted(run_id="only", agent="a", producer=P, occurred_at=at(1))])
    one, two = f"sqlite://{tmp_path / 'one.sqlite3'}", f"sqlite://{tmp_path / 'two.sqlite3'}"
    await rebuild(settings, one, workers=1)
    assert (await rebuild(settings, two, workers=2)).records == 1
    assert snapshot(two) == snapshot(one)
    _assert_no_stages(two)
