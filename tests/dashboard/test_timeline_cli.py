"""``ledger run RUN_ID --timeline`` in the terminal, from a real projection."""

from __future__ import annotations

from config.settings import Settings
from tests.dashboard.conftest import project_all
from tests.ledger.test_cli import ledger
from tests.projections.scenarios import incident_log, publish, requested


async def test_run_timeline_answers_and_orders_the_steps(settings: Settings) -> None:
    await publish(settings, incident_log())
    dsn = f"sqlite://{settings.data_dir / 'timeline.sqlite3'}"
    await project_all(settings, dsn)
    done = ledger(settings, "run", "run-a", "--timeline", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "run run-a"
    assert lines[1].split() == ["did", "execution", "finish?", "finished:", "succeeded"]
    unknown = requested("run-a", 3, 1)
    assert any(
        "webhook http://127.0.0.1:9/hooks/3: UNKNOWN, unknown (awaiting reconciliation)" in line
        for line in lines
    )
    assert f"key at the receiver:  {unknown.idempotency_key}" in done.stdout
    steps = [line for line in lines if "●" in line]
    assert "run started by reporter" in steps[0]
    assert "+0.000s" in steps[0]
    assert "duplicate request (deduplicated)" in steps[-1]
    assert "+51.000s" in steps[-1]
    stamps = [line.split("●")[0].split("+")[0].strip() for line in steps]
    assert stamps == sorted(stamps)

    missing = ledger(settings, "run", "nope", "--timeline", "--dsn", dsn)
    assert missing.returncode == 1
    assert "run nope is not in the projection" in missing.stderr
