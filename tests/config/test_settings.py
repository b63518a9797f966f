"""Settings in parts: the lease rule across parts, the environment's nested names, and
``changed``, the one validated way to derive settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.legacy import ROOT_FIELDS, is_settings_variable
from config.settings import Settings, changed, settings_environment, with_channel
from tests.source import parse

ROOT = Path(__file__).resolve().parents[2]


def refused(**parts: dict[str, object]) -> str:
    """The one-line reason pydantic gives for refusing ``parts``."""
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate(parts)
    [error] = caught.value.errors()
    message = str(error["msg"])
    assert "\n" not in message
    return message


def test_a_channel_deadline_replaces_the_global_one_for_that_channel_only() -> None:
    settings = Settings.model_validate(
        {
            "channels": {
                "send_deadline_s": 2,
                "send_deadlines": {"browser": 6},
                "http_timeout_s": 1,
            },
            "worker": {"lease_s": 16},
        }
    )
    assert settings.channels.deadline_for("browser") == 6
    assert settings.channels.deadline_for("webhook") == 2
    assert settings.channels.longest_send_deadline_s == 6


def test_a_lease_not_longer_than_the_longest_channel_deadline_plus_margin_is_refused() -> None:
    message = refused(
        channels={"send_deadline_s": 2, "send_deadlines": {"browser": 20}},
        worker={"lease_s": 16, "clock_skew_margin_s": 1},
    )
    assert (
        "worker.lease_s=16 must exceed channels.send_deadlines[browser]=20 + "
        "worker.clock_skew_margin_s=1"
    ) in message
    # Exactly deadline + margin is not enough either: the lease must exceed it.
    message = refused(
        channels={"send_deadlines": {"browser": 15}},
        worker={"lease_s": 16, "clock_skew_margin_s": 1},
    )
    assert "channels.send_deadlines[browser]=15" in message


def test_the_global_deadline_still_counts_when_it_is_the_longest() -> None:
    message = refused(
        channels={"send_deadline_s": 10, "send_deadlines": {"webhook": 1}}, worker={"lease_s": 11}
    )
    assert "worker.lease_s=11 must exceed channels.send_deadline_s=10" in message


def test_an_http_timeout_longer_than_the_shortest_deadline_is_refused() -> None:
    message = refused(
        channels={"http_timeout_s": 3, "send_deadline_s": 5, "send_deadlines": {"slack": 2}},
        worker={"lease_s": 30},
    )
    assert "channels.http_timeout_s=3 must not exceed channels.send_deadlines[slack]=2" in message


def test_the_env_variables_are_nested_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_CHANNELS__SEND_DEADLINES", '{"browser": 20}')
    monkeypatch.setenv("LEDGER_WORKER__LEASE_S", "30")
    assert Settings().channels.deadline_for("browser") == 20
    # A whole part as one JSON object; its own variables win over it.
    monkeypatch.setenv("LEDGER_WORKER", '{"lease_s": 40, "group": "from-json"}')
    settings = Settings()
    assert (settings.worker.lease_s, settings.worker.group) == (30, "from-json")


def test_a_misspelled_variable_is_refused_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_WORKER__LEASE_SECONDS", "30")
    with pytest.raises(ValidationError, match="lease_seconds"):
        Settings()


def test_other_ledger_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_TEST_SOMETHING", "1")
    Settings()
    assert not is_settings_variable("LEDGER_TEST_SOMETHING")
    assert is_settings_variable("LEDGER_WORKER__LEASE_S")
    assert is_settings_variable("LEDGER_LEASE_SECONDS")
    assert is_settings_variable("LEDGER_DATA_DIR")


def test_the_root_fields_are_known_to_the_legacy_reader() -> None:
    assert set(Settings.model_fields) == ROOT_FIELDS


@pytest.mark.parametrize("value", [0, -1])
def test_a_non_positive_channel_deadline_is_refused(value: float) -> None:
    message = refused(channels={"send_deadlines": {"browser": value}})
    assert f"channels.send_deadlines[browser]={value:g} must be positive" in message


def test_changed_validates_and_refuses_unknown_names() -> None:
    base = Settings()
    assert changed(base, {"worker.lease_s": 45}).worker.lease_s == 45
    assert changed(base, {"data_dir": "/tmp/x"}).data_dir == Path("/tmp/x")
    with pytest.raises(KeyError, match="lease_seconds"):
        changed(base, {"lease_seconds": 45})  # a flat name of before
    with pytest.raises(KeyError, match="lease_seconds"):
        changed(base, {"worker.lease_seconds": 45})
    with pytest.raises(KeyError, match="not a part"):
        changed(base, {"data_dir.name": "x"})
    with pytest.raises(ValidationError, match="must exceed"):
        changed(base, {"worker.lease_s": 1})
    with pytest.raises(ValidationError):
        changed(base, {"worker.lease_s": "soon"})


def test_model_copy_is_refused_on_settings_and_their_parts() -> None:
    """``model_copy(update=...)`` validates nothing: a stale name would do nothing."""
    settings = Settings()
    with pytest.raises(TypeError, match="changed"):
        settings.model_copy(update={"lease_seconds": 1})
    with pytest.raises(TypeError, match="changed"):
        settings.worker.model_copy(update={"lease_s": 1})


def test_no_code_copies_settings_with_model_copy() -> None:
    """The runtime refusal above covers what runs; this covers what a test never runs:
    no ``.model_copy(update=...)`` whose keys are settings names anywhere in the tree."""
    names = set(Settings.model_fields)
    for part in Settings.model_fields.values():
        if isinstance(part.annotation, type) and hasattr(part.annotation, "model_fields"):
            names |= set(part.annotation.model_fields)
    names -= {"allowed_networks"}  # also a WebhookEndpoint field, copied in a test
    found = []
    for path in ROOT.glob("**/*.py"):
        if ".venv" in path.parts or "site-packages" in path.parts or path == Path(__file__):
            continue  # (this file shows the refusal above)
        tree = parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "model_copy"
            ):
                continue
            for keyword in node.keywords:
                keys = keyword.value.keys if isinstance(keyword.value, ast.Dict) else [None]
                if keyword.arg == "update" and any(
                    key is None or (isinstance(key, ast.Constant) and key.value in names)
                    for key in keys
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "use config.settings.changed, not model_copy(update=...)"


def test_a_child_environment_reads_back_the_same_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = with_channel(
        changed(Settings(), {"worker.lease_s": 44, "dashboard.token": "t0ken", "faults": ["a"]}),
        "slack",
        {"tokens": {"acme": "xoxb-1"}},
    )
    for name, value in settings_environment(settings).items():
        monkeypatch.setenv(name, value)
    again = Settings()
    assert again == settings
    assert again.dashboard.token is not None
    assert again.dashboard.token.get_secret_value() == "t0ken"
