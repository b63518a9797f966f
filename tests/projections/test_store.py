"""The projection contract, run on SQLite and on PostgreSQL against a real broker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from config.settings import Settings
from events import DeliverySent
from events.errors import LedgerError
from projections.backends import open_store
from projections.projector import project, rebuild
from projections.schema import SCHEMA_VERSION
from projections.store import Store
from tests.fixtures.postgres import DsnFactory
from tests.fixtures.private import readable_by_others
from tests.projections.scenarios import (
    P,
    at,
    incident_log,
    publish,
    requested,
)


def opened(dsn: str) -> Store:
    store = open_store(dsn)
    store.prepare("read")
    return store


async def test_incident_log_folds_into_the_ledger_tables(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    ghost = requested("run-z", 9, 1)  # never requested: its Sent has no delivery to land on
    orphan = DeliverySent(
        idempotency_key=ghost.idempotency_key,
        run_id="run-z",
        attempt=1,
        fencing_token=1,
        worker_id="w",
        producer=P,
        occurred_at=at(5),
    )
    await publish(
        settings, [*incident_log(), orphan], raw=[(settings.kafka.topic_deliveries, b"{not json")]
    )
    dsn = dsn_factory()
    stats = await rebuild(settings, dsn)
    assert stats.skipped == 2
    store = opened(dsn)
    try:
        runs = {r["run_id"]: r for r in store.rows("SELECT * FROM agent_runs")}
        assert {k: r["status"] for k, r in runs.items()} == {
            "run-a": "SUCCEEDED",
            "run-b": "SUCCEEDED",
            "run-c": "RUNNING",
        }
        assert runs["run-a"]["created_at"] == "2026-01-05T09:00:00.000000Z"
        assert runs["run-a"]["finished_at"] == "2026-01-05T09:00:01.000000Z"

        rows = store.rows("SELECT * FROM deliveries ORDER BY run_id, recipient")
        assert [(r["run_id"], r["recipient"][-1], r["status"], r["attempts"]) for r in rows] == [
            ("run-a", "1", "CONFIRMED", 1),
            ("run-a", "2", "CONFIRMED", 2),
            ("run-a", "3", "UNKNOWN", 1),
            ("run-a", "4", "FAILED", 2),
            ("run-b", "1", "PENDING", 0),
            ("run-c", "1", "CONFIRMED", 1),
        ]
        retried = rows[1]
        assert retried["provider_message_id"] == f"msg-{retried['idempotency_key'][:6]}-2"
        assert retried["created_at"] == "2026-01-05T09:00:01.000000Z"
        assert retried["updated_at"] == "2026-01-05T09:00:51.000000Z"  # the duplicate request
        assert rows[3]["last_error_class"] == "http_4xx"
        assert rows[4]["slo_deadline"] == "2026-01-05T09:02:10.000000Z"

        attempts = store.rows(
            "SELECT attempt, outcome, error_class, reconciliation FROM delivery_attempts "
            "WHERE idempotency_key = ? ORDER BY attempt",
            (retried["idempotency_key"],),
        )
        assert attempts == [
            {
                "attempt": 1,
                "outcome": "RETRY",
                "error_class": "timeout_after_write",
                "reconciliation": "not_found",
            },
            {"attempt": 2, "outcome": "CONFIRMED", "error_class": None, "reconciliation": None},
        ]
        dups = store.rows("SELECT outcome FROM duplicate_keys ORDER BY outcome")
        assert [d["outcome"] for d in dups] == ["conflict", "deduplicated"]
        skipped = store.rows("SELECT reason FROM skipped_records ORDER BY reason")
        assert skipped[0]["reason"] == (
            f"delivery.sent for key {ghost.idempotency_key} that was never requested"
        )
        assert skipped[1]["reason"].startswith("value is not JSON")
    finally:
        store.close()


async def test_rebuilding_twice_gives_identical_dumps(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    await publish(settings, incident_log(), raw=[(settings.kafka.topic_runs, b"\xff")])
    first, second = dsn_factory(), dsn_factory()
    await rebuild(settings, first, batch_size=3)
    await rebuild(settings, second, batch_size=1000)
    one, two = opened(first), opened(second)
    try:
        assert one.dump() == two.dump()
        assert len(one.dump()["deliveries"]) == 6
    finally:
        one.close()
        two.close()


async def test_resuming_from_stored_offsets_applies_each_event_once(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    log = incident_log()
    await publish(settings, log[:10])
    live_dsn = dsn_factory()
    await rebuild(settings, live_dsn)
    await publish(settings, log[10:])
    live = opened(live_dsn)
    try:
        again = await project(settings, live, until="end")
        assert again.applied == len(log) - 10  # only the new events
        # Records already covered by the stored offsets are dropped, not applied twice.
        replayed = await project(settings, live, until="end")
        assert replayed.records == 0
        whole = dsn_factory()
        await rebuild(settings, whole)
        fresh = opened(whole)
        try:
            assert live.dump() == fresh.dump()
        finally:
            fresh.close()
    finally:
        live.close()


async def test_a_projection_of_another_schema_version_is_refused(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    await publish(settings, incident_log()[:3])
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = opened(dsn)
    store.begin()
    store.rows("UPDATE projection_meta SET value = ? WHERE name = ?", ("0", "schema_version"))
    store.commit()
    store.close()
    store = open_store(dsn)
    try:
        with pytest.raises(LedgerError) as caught:
            store.prepare("project")
        message = caught.value.message
        assert f"is version 0, this ledger needs version {SCHEMA_VERSION}" in message
        assert "rebuild it from the log" in message
        assert "\n" not in message
    finally:
        store.close()
    with pytest.raises(LedgerError, match="already holds ledger tables"):
        await rebuild(settings, dsn)
    await rebuild(settings, dsn, replace=True)
    store = opened(dsn)
    store.close()


async def test_a_sqlite_projection_is_owner_only(settings: Settings, tmp_path: Path) -> None:
    """Payloads, recipients and evidence: the database, its WAL and a folder made for it
    are 0600 / 0700, whatever the umask."""
    await publish(settings, incident_log())
    path = tmp_path / "data" / "projection" / "ledger.db"
    previous = os.umask(0o022)
    try:
        await rebuild(settings, f"sqlite://{path}")
    finally:
        os.umask(previous)
    assert path.exists()
    assert readable_by_others(tmp_path / "data") == []
