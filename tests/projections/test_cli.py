"""The projection commands end to end, as a user runs them: real broker, real databases."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from config.settings import Settings
from projections.backends import open_store
from projections.schema import SCHEMA_VERSION
from tests.fixtures.postgres import DsnFactory
from tests.projections.operator_scenario import operator_log
from tests.projections.scenarios import incident_log, publish, requested
from tests.projections.test_projector import ledger_env


def ledger(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=ledger_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_rebuild_then_verify_finds_a_tampered_row(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    await publish(settings, incident_log())
    live = dsn_factory()
    built = ledger(settings, "rebuild", "--into", live)
    assert built.returncode == 0, built.stderr
    assert "events applied, 0 skipped" in built.stdout
    # The progress bar is for a terminal: none (and no control codes) into a pipe.
    assert "rebuilding" not in built.stderr
    assert "\x1b" not in built.stderr

    ok = ledger(settings, "verify", "--dsn", live)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "identical: rebuilt equals live" in ok.stdout
    assert "every delivery agrees with the worker's rules" in ok.stdout

    a1 = requested("run-a", 1, 1)
    store = open_store(live)
    store.begin()
    store.rows("UPDATE deliveries SET status = 'FAILED' WHERE idempotency_key = ?",
               (a1.idempotency_key,))  # fmt: skip
    store.commit()
    store.close()
    bad = ledger(settings, "verify", "--dsn", live)
    assert bad.returncode == 1
    assert (
        f"deliveries [{a1.idempotency_key}]: differs: status: live='FAILED' rebuilt='CONFIRMED'"
        in bad.stdout
    )
    assert "1 differences between live and rebuilt" in bad.stdout
    assert (
        f"delivery {a1.idempotency_key} (run run-a): worker's rules differ: "
        "status: projected='FAILED' worker='CONFIRMED'" in bad.stdout
    )
    assert "1 deliveries differ from the worker's rules" in bad.stdout

    again = ledger(settings, "rebuild", "--into", live)
    assert again.returncode == 1
    assert "already holds ledger tables" in again.stderr
    assert "--replace" in again.stderr


async def test_status_and_run_in_the_terminal_and_as_json(settings: Settings) -> None:
    await publish(settings, incident_log())
    dsn = f"sqlite://{settings.data_dir / 'live.sqlite3'}"
    assert ledger(settings, "rebuild", "--into", dsn).returncode == 0

    table = ledger(settings, "status", "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    # run-b's delivery, requested at T0+100s, still pending now (the real clock).
    assert "pending now: 1, the oldest requested at 2026-01-05T09:01:40.000000Z (" in table.stdout
    assert "pending by channel: 1" in table.stdout
    for title in (
        "pending deliveries past their SLO: 1",
        "unknown deliveries awaiting reconciliation: 1",
        "confirmed deliveries with no execution result: 1",
        "duplicate-key conflicts: 1",
        "attempts by channel and error class: 6",
    ):
        assert title in table.stdout

    as_json = ledger(settings, "status", "--dsn", dsn, "--json")
    report = json.loads(as_json.stdout)
    assert [r["run_id"] for r in report["overdue_pending"]] == ["run-b"]
    assert report["backlog"]["pending_now"] == 1
    assert report["backlog"]["oldest_age_seconds"] > 0
    assert [c["channel"] for c in report["backlog"]["by_channel"]] == ["webhook"]
    assert [r["run_id"] for r in report["confirmed_without_result"]] == ["run-c"]

    run = ledger(settings, "run", "run-a", "--dsn", dsn)
    assert run.returncode == 0, run.stderr
    a2 = requested("run-a", 2, 1)
    assert "run run-a: execution finished: succeeded" in run.stdout
    assert f"idempotency key (what the receiver sees): {a2.idempotency_key}" in run.stdout
    assert f"provider message id: msg-{a2.idempotency_key[:6]}-2" in run.stdout
    view = json.loads(ledger(settings, "run", "run-a", "--dsn", dsn, "--json").stdout)
    assert len(view["deliveries"]) == 4
    assert view["timeline"][0]["what"] == "run started by reporter"

    missing = ledger(settings, "run", "nope", "--dsn", dsn)
    assert missing.returncode == 1
    assert "error: run nope is not in the projection" in missing.stderr


async def test_commands_refuse_an_old_schema_with_one_line(settings: Settings) -> None:
    await publish(settings, incident_log()[:4])
    dsn = f"sqlite://{settings.data_dir / 'old.sqlite3'}"
    assert ledger(settings, "rebuild", "--into", dsn).returncode == 0
    store = open_store(dsn)
    store.begin()
    store.rows("UPDATE projection_meta SET value = '0' WHERE name = 'schema_version'")
    store.commit()
    store.close()
    for args in (("project", "--dsn", dsn), ("status", "--dsn", dsn)):
        done = ledger(settings, *args)
        assert done.returncode == 1
        first = done.stderr.splitlines()[0]
        assert first.startswith("error: projection schema at")
        assert (
            f"is version 0, this ledger needs version {SCHEMA_VERSION}: rebuild it from the log"
            in first
        )
        assert "Traceback" not in done.stderr

    default = ledger(settings, "status")  # the data dir's default SQLite file: none yet
    assert default.returncode == 1
    assert "error: no projection at sqlite://" in default.stderr


async def test_offsets_beyond_the_log_end_stop_with_one_line_and_a_hint(
    settings: Settings,
) -> None:
    """Topics recreated under a projection: its stored offsets lie beyond the log's end.
    project and verify say so at once instead of dropping records or waiting forever."""
    await publish(settings, incident_log()[:4])
    dsn = f"sqlite://{settings.data_dir / 'ahead.sqlite3'}"
    assert ledger(settings, "rebuild", "--into", dsn).returncode == 0
    store = open_store(dsn)
    store.begin()
    store.rows("UPDATE projection_offsets SET next_offset = next_offset + 1000")
    store.commit()
    store.close()
    for args in (("project", "--dsn", dsn), ("verify", "--dsn", dsn)):
        began = time.monotonic()
        done = ledger(settings, *args)
        assert time.monotonic() - began < 60
        assert done.returncode == 1, done.stdout + done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith(("error", "hint"))]
        assert lines[0].startswith("error: the projection has read "), done.stderr
        assert "but the log ends at" in lines[0]
        assert "topics were recreated" in lines[0]
        assert lines[1] == "hint: rebuild it from the log: ledger rebuild --into DSN --replace"
        assert "Traceback" not in done.stderr


async def test_verify_sees_a_projection_that_folds_by_other_rules(settings: Settings) -> None:
    """A rebuild of itself cannot show that a projection's rules differ from the worker's:
    both copies share them. verify also re-folds the log by the worker's rules."""
    await publish(settings, incident_log())
    live = f"sqlite://{settings.data_dir / 'live.sqlite3'}"
    again = f"sqlite://{settings.data_dir / 'again.sqlite3'}"
    a3 = requested("run-a", 3, 1)  # UNKNOWN after a reset: a rule that called it FAILED
    for dsn in (live, again):
        assert ledger(settings, "rebuild", "--into", dsn).returncode == 0
        store = open_store(dsn)
        store.begin()
        store.rows("UPDATE deliveries SET status = 'FAILED' WHERE idempotency_key = ?",
                   (a3.idempotency_key,))  # fmt: skip
        store.commit()
        store.close()
    done = ledger(settings, "verify", "--dsn", live, "--against", again)
    assert done.returncode == 1
    assert "differences between live and rebuilt" not in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith("delivery ")]
    assert lines == [
        f"delivery {a3.idempotency_key} (run run-a): worker's rules differ: "
        "status: projected='FAILED' worker='UNKNOWN'"
    ]
    assert "1 deliveries differ from the worker's rules" in done.stdout


async def test_status_shows_the_operator_counters(settings: Settings) -> None:
    # Operator events signed with the operator key (tests/conftest.py), as 'ledger resolve'.
    await publish(settings, operator_log())
    dsn = f"sqlite://{settings.data_dir / 'ops.sqlite3'}"
    built = ledger(settings, "rebuild", "--into", dsn)
    assert built.returncode == 0, built.stderr

    table = ledger(settings, "status", "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    assert "settled by an operator: delivered 1, not_delivered 1, abandoned 1" in table.stdout
    assert "redrives: applied 2, refused 2" in table.stdout
    # U[3], UNKNOWN since T0+5s, is the oldest of the two (the real clock: long ago).
    assert "unknown now: 2, the oldest unknown since 2026-01-05T09:00:05.000000Z (" in table.stdout

    report = json.loads(ledger(settings, "status", "--dsn", dsn, "--json").stdout)
    ops = report["operators"]
    assert ops["settled"] == {"delivered": 1, "not_delivered": 1, "abandoned": 1}
    assert ops["redrives"] == {"applied": 2, "refused": 2}
    assert ops["unknown_now"] == 2
    assert ops["oldest_unknown_since"] == "2026-01-05T09:00:05.000000Z"
    assert ops["oldest_unknown_age_seconds"] > 3600
