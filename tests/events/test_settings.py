"""Settings validation: the per-channel send deadlines against the lease rule."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config.settings import Settings


def refused(**fields: object) -> str:
    """The one-line reason pydantic gives for refusing ``fields``."""
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate(fields)
    [error] = caught.value.errors()
    message = str(error["msg"])
    assert "\n" not in message
    return message


def test_a_channel_deadline_replaces_the_global_one_for_that_channel_only() -> None:
    settings = Settings.model_validate(
        {
            "send_deadline_s": 2,
            "send_deadlines": {"browser": 6},
            "lease_seconds": 16,
            "http_timeout_s": 1,
        }
    )
    assert settings.deadline_for("browser") == 6
    assert settings.deadline_for("webhook") == 2
    assert settings.longest_send_deadline_s == 6


def test_a_lease_not_longer_than_the_longest_channel_deadline_plus_margin_is_refused() -> None:
    message = refused(
        send_deadline_s=2, send_deadlines={"browser": 20}, lease_seconds=16, clock_skew_margin_s=1
    )
    assert "lease_seconds=16 must exceed send_deadlines[browser]=20 + clock_skew_margin_s=1" in (
        message
    )
    # Exactly deadline + margin is not enough either: the lease must exceed it.
    message = refused(send_deadlines={"browser": 15}, lease_seconds=16, clock_skew_margin_s=1)
    assert "send_deadlines[browser]=15" in message


def test_the_global_deadline_still_counts_when_it_is_the_longest() -> None:
    message = refused(send_deadline_s=10, send_deadlines={"webhook": 1}, lease_seconds=11)
    assert "lease_seconds=11 must exceed send_deadline_s=10" in message


def test_an_http_timeout_longer_than_the_shortest_deadline_is_refused() -> None:
    message = refused(
        http_timeout_s=3, send_deadline_s=5, send_deadlines={"slack": 2}, lease_seconds=30
    )
    assert "http_timeout_s=3 must not exceed send_deadlines[slack]=2" in message


def test_the_env_variable_is_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_SEND_DEADLINES", '{"browser": 20}')
    monkeypatch.setenv("LEDGER_LEASE_SECONDS", "30")
    assert Settings().deadline_for("browser") == 20


@pytest.mark.parametrize("value", [0, -1])
def test_a_non_positive_channel_deadline_is_refused(value: float) -> None:
    message = refused(send_deadlines={"browser": value})
    assert f"send_deadlines[browser]={value:g} must be positive" in message
