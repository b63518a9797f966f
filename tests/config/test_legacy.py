"""The flat LEDGER_* names of before still work: each is read into its new place, with a
warning naming the new variable; where both are set, the new one wins and says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from config.channels import slack_settings
from config.legacy import MOVED, DeprecatedSettingWarning, old_variable
from config.settings import Settings


def test_every_old_name_has_a_place_in_the_new_layout() -> None:
    for name, moved in MOVED.items():
        model: type[BaseModel] = Settings
        path = moved.path[:2] if moved.path[:2] == ("channels", "settings") else moved.path
        for depth, field in enumerate(path):
            assert field in model.model_fields, (name, moved.path)
            if depth < len(path) - 1:
                annotation = model.model_fields[field].annotation
                assert isinstance(annotation, type)
                assert issubclass(annotation, BaseModel)
                model = annotation
    # The 74 fields of the flat Settings but the 4 the root keeps under their names
    # (data_dir, cache_dir, event_loop, faults), and LEDGER_PROJECTION_DSN that --dsn read.
    assert len(MOVED) == 74 - 4 + 1
    assert not set(MOVED) & set(Settings.model_fields)


def test_an_old_name_is_read_with_a_warning_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEDGER_LEASE_SECONDS", "45")
    with pytest.warns(DeprecatedSettingWarning) as caught:
        settings = Settings()
    assert settings.worker.lease_s == 45
    [warning] = [w for w in caught if "LEDGER_LEASE_SECONDS" in str(w.message)]
    assert "set LEDGER_WORKER__LEASE_S instead" in str(warning.message)


def test_milliseconds_become_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_WORKER_LINGER_MS", "250")
    monkeypatch.setenv("LEDGER_PUBLISHER_TRANSACTION_TIMEOUT_MS", "20000")
    with pytest.warns(DeprecatedSettingWarning, match=r"LEDGER_WORKER__LINGER_S \(milliseconds"):
        settings = Settings()
    assert settings.worker.linger_s == pytest.approx(0.25)
    assert settings.publisher.transaction_timeout_s == pytest.approx(20.0)


def test_the_new_name_wins_and_the_warning_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_WORKER_FETCH_WAIT_MS", "500")
    monkeypatch.setenv("LEDGER_WORKER__FETCH_WAIT_S", "0.1")
    with pytest.warns(DeprecatedSettingWarning) as caught:
        settings = Settings()
    assert settings.worker.fetch_wait_s == pytest.approx(0.1)
    [warning] = [w for w in caught if "LEDGER_WORKER_FETCH_WAIT_MS" in str(w.message)]
    assert "ignored: LEDGER_WORKER__FETCH_WAIT_S is set too and wins" in str(warning.message)


def test_a_whole_part_given_as_json_counts_as_the_new_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEDGER_DASHBOARD_PORT", "9000")
    monkeypatch.setenv("LEDGER_DASHBOARD", '{"port": 9100}')
    with pytest.warns(DeprecatedSettingWarning, match="is set too and wins"):
        assert Settings().dashboard.port == 9100


def test_slack_s_old_variables_become_its_channel_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_SLACK_TOKENS", '{"acme": "xoxb-1"}')
    monkeypatch.setenv("LEDGER_SLACK_LOOKUP_MAX_PAGES", "3")
    monkeypatch.setenv("LEDGER_CHANNELS__SETTINGS", '{"slack": {"api_url": "http://127.0.0.1:9"}}')
    with pytest.warns(DeprecatedSettingWarning, match="LEDGER_CHANNELS__SETTINGS"):
        slack = slack_settings(Settings().channels)
    assert slack.tokens["acme"].get_secret_value() == "xoxb-1"
    assert slack.lookup_max_pages == 3
    assert slack.api_url == "http://127.0.0.1:9/"


def test_the_old_channel_settings_and_the_old_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_CHANNEL_SETTINGS", '{"smtp": {"host": "relay.test"}}')
    monkeypatch.setenv("LEDGER_PROJECTION_DSN", "sqlite:///tmp/x.sqlite3")
    with pytest.warns(DeprecatedSettingWarning):
        settings = Settings()
    assert settings.channels.settings["smtp"].get_secret_value() == {"host": "relay.test"}
    assert settings.projection.dsn == "sqlite:///tmp/x.sqlite3"


def test_a_bad_old_value_is_refused_at_its_new_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_WORKER_LINGER_MS", "soon")
    with pytest.warns(DeprecatedSettingWarning), pytest.raises(ValueError, match="linger_s"):
        Settings()


def test_the_compose_file_and_the_scripts_use_the_new_names() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [root / "docker-compose.yml", *sorted((root / "scripts").iterdir())]
    old = {old_variable(name) for name in MOVED}
    for path in files:
        used = set(re.findall(r"\bLEDGER_[A-Z0-9_]+", path.read_text(errors="replace")))
        assert not used & old, (path.name, sorted(used & old))


def test_the_cli_says_it_once_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env["LEDGER_LEASE_SECONDS"] = "40"
    done = subprocess.run(
        [sys.executable, "-m", "ledger", "channels", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    said = [line for line in done.stderr.splitlines() if "LEDGER_LEASE_SECONDS" in line]
    assert said == [
        "warning: LEDGER_LEASE_SECONDS is deprecated: set LEDGER_WORKER__LEASE_S instead"
    ]
