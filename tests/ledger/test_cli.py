"""The CLI end to end against the real broker: publish, replay, bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

from config.settings import Settings, changed


def ledger(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        {
            "LEDGER_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "LEDGER_KAFKA__TOPIC_RUNS": settings.kafka.topic_runs,
            "LEDGER_KAFKA__TOPIC_DELIVERIES": settings.kafka.topic_deliveries,
            "LEDGER_KAFKA__TOPIC_DEADLETTER": settings.kafka.topic_deadletter,
            "LEDGER_CHANNELS__ALLOWED_NETWORKS": '["127.0.0.0/8"]',
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "ledger", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ledger_worker(**env: str) -> subprocess.CompletedProcess[str]:
    """``ledger worker`` with ``env`` over this process's environment (it should refuse)."""
    return subprocess.run(
        [sys.executable, "-m", "ledger", "worker"],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_publish_then_replay_json(settings: Settings, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text('{"text": "report ready"}')
    done = ledger(
        settings,
        "publish",
        "run-cli",
        "--result-hash",
        "sha256:1",
        "--delivery",
        "webhook:http://127.0.0.1:9/a",
        "--delivery",
        "provider:http://127.0.0.1:9/b",
        "--payload",
        f"@{payload}",
    )
    assert done.returncode == 0, done.stderr
    assert "RunSucceeded + 2 DeliveryRequested committed" in done.stdout
    other = ledger(
        settings, "publish", "run-other", "--result-hash", "h", "-d", "webhook:http://127.0.0.1:9/a"
    )
    assert other.returncode == 0, other.stderr

    replayed = ledger(settings, "replay", "--run-id", "run-cli", "--json")
    assert replayed.returncode == 0, replayed.stderr
    lines = [json.loads(line) for line in replayed.stdout.splitlines()]
    types = sorted(line["event"]["type"] for line in lines)
    assert types == ["delivery.requested", "delivery.requested", "run.succeeded"]
    assert {line["event"]["payload"]["text"] for line in lines if "payload" in line["event"]} == {
        "report ready"
    }

    key = next(
        line["event"]["idempotency_key"]
        for line in lines
        if line["event"]["type"] == "delivery.requested"
    )
    by_key = ledger(settings, "replay", "--key", key)
    assert by_key.returncode == 0
    assert by_key.stdout.count("delivery.requested") == 1
    assert key[:12] in by_key.stdout


def test_bad_input_is_refused_with_one_line(settings: Settings) -> None:
    cases = [
        (["-d", "carrier-pigeon:http://127.0.0.1:9/a"], "unknown channel 'carrier-pigeon'"),
        (["-d", "webhook:mailto:someone"], "must be an http(s) URL"),
        (["-d", "webhook:http://127.0.0.1:9/a", "--payload", "{oops"], "payload is not JSON"),
    ]
    for extra, message in cases:
        done = ledger(settings, "publish", "run-bad", "--result-hash", "h", *extra)
        assert done.returncode == 2, done
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    replayed = ledger(settings, "replay", "--json")
    assert replayed.stdout == ""


def test_no_broker_is_one_line(settings: Settings) -> None:
    env_settings = changed(settings, {"kafka.bootstrap_servers": "127.0.0.1:1"})
    done = ledger(env_settings, "replay")
    assert done.returncode == 1
    assert "error: no Kafka broker answers at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_lease_too_short_for_the_lease_rule_is_refused_with_one_line() -> None:
    done = ledger_worker(LEDGER_WORKER__LEASE_S="5", LEDGER_CHANNELS__SEND_DEADLINE_S="10")
    assert done.returncode == 2  # a bad setting is bad input
    assert (
        "error: invalid settings: LEDGER_WORKER__LEASE_S=5 must exceed "
        "LEDGER_CHANNELS__SEND_DEADLINE_S=10" in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_send_deadline_for_a_channel_that_is_not_installed_is_refused_with_one_line() -> None:
    done = ledger_worker(
        LEDGER_CHANNELS__SEND_DEADLINES='{"pigeon": 20}',
        LEDGER_CHANNELS__WEBHOOK_SECRET="whsec_dGVzdC1jbGktc2VjcmV0LWJ5dGVzLTI0Yg==",
        LEDGER_KAFKA__BOOTSTRAP_SERVERS="127.0.0.1:9",
    )
    assert done.returncode != 0
    assert (
        "error: LEDGER_CHANNELS__SEND_DEADLINES names channels that are not installed: pigeon"
        in done.stderr
    )
    assert "hint: see `ledger channels`" in done.stderr
    assert "Traceback" not in done.stderr
