"""Retry policy: deterministic jitter within its bounds, Retry-After, limits, settings."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.settings import Settings
from events.retry_policy import DEFAULT_POLICIES, RetryPolicy, jitter_fraction
from streams.retry import rules_for

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@given(st.text(min_size=1, max_size=80), st.integers(min_value=1, max_value=500))
def test_delay_is_deterministic_and_within_jitter_bounds(key: str, attempt: int) -> None:
    policy = RetryPolicy(base_delay_s=1.0, multiplier=2.0, max_delay_s=300.0, jitter=0.5)
    first = policy.delay_s(key, attempt)
    assert first == policy.delay_s(key, attempt)  # no randomness, no clock
    backoff = policy.backoff_s(attempt)
    assert backoff * 0.5 <= first <= backoff
    assert 0.0 <= jitter_fraction(key, attempt) < 1.0


def test_backoff_grows_exponentially_then_caps() -> None:
    policy = RetryPolicy(base_delay_s=1.0, multiplier=2.0, max_delay_s=10.0)
    assert [policy.backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.backoff_s(10_000) == 10.0  # no overflow on absurd attempt numbers


def test_jitter_spreads_keys_instead_of_synchronising_them() -> None:
    policy = RetryPolicy(base_delay_s=8.0, jitter=0.5)
    delays = {round(policy.delay_s(f"key-{i}", 1), 6) for i in range(200)}
    assert len(delays) > 150
    assert min(delays) < 4.5  # the range is actually used
    assert max(delays) > 7.5


def test_retry_after_is_honoured_but_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_retry_after_s=60.0)
    assert policy.delay_s("k", 1, retry_after_s=30.0) == 30.0
    assert policy.delay_s("k", 1, retry_after_s=10_000.0) == 60.0
    # A Retry-After shorter than the backoff never shortens it.
    assert policy.delay_s("k", 5, retry_after_s=0.1) == policy.delay_s("k", 5)


def test_exhausted_by_attempts_or_by_age() -> None:
    policy = RetryPolicy(max_attempts=3, max_age_s=60.0)
    assert not policy.exhausted(2, T0, T0 + timedelta(seconds=59))
    assert policy.exhausted(3, T0, T0 + timedelta(seconds=1))
    assert policy.exhausted(1, T0, T0 + timedelta(seconds=60))


def test_invalid_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=1.5)
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_rules_for_gives_channel_defaults_and_overrides() -> None:
    fast = RetryPolicy(base_delay_s=0.01, max_attempts=2)
    rules = rules_for(Settings().channels, {"provider": fast})
    assert rules("webhook") == DEFAULT_POLICIES["webhook"]
    assert rules("provider") is fast
    with pytest.raises(KeyError, match="sms"):
        rules("sms")


def test_policies_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_CHANNELS__RETRY_POLICIES", '{"webhook": {"max_attempts": 3}}')
    webhook = rules_for(Settings().channels)("webhook")
    # The field given replaces the channel's default; the others stay the channel's.
    assert webhook.max_attempts == 3
    assert webhook.base_delay_s == DEFAULT_POLICIES["webhook"].base_delay_s == 2.0
    assert rules_for(Settings().channels)("provider") == DEFAULT_POLICIES["provider"]
    monkeypatch.setenv("LEDGER_CHANNELS__RETRY_POLICIES", '{"webhook": {"jitter": 2}}')
    with pytest.raises(ValueError, match="jitter"):
        Settings()


def test_an_installed_plugin_channel_gets_the_field_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, its first retry raised KeyError and left the delivery UNKNOWN for good.
    monkeypatch.setattr("streams.retry.channel_names", lambda: ["acme"])
    assert rules_for(Settings().channels)("acme") == RetryPolicy()
