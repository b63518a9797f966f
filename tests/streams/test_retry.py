"""Retry policy: deterministic jitter within its bounds, Retry-After, limits, settings."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from config.settings import Settings
from events.delivery import DeliveryFailed, DeliveryRetryScheduled
from events.endpoints import EndpointSpec, register, update
from events.outcomes import ErrorClass
from events.retry_policy import DEFAULT_POLICIES, RetryPolicy, jitter_fraction
from streams.decisions import retry_or_fail
from streams.endpoint_gate import EndpointGate
from streams.retry import RegistryRetryPolicies, endpoint_rules, rules_for
from tests.fixtures.core import applied, core_context, requested
from tests.streams.test_endpoint_gate import WHO, Table

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


def test_a_registered_endpoints_policy_wins_over_the_environment_and_follows_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEDGER_CHANNELS__RETRY_POLICIES", '{"webhook": {"max_attempts": 7}}')
    table = Table()
    gate = EndpointGate(table)
    rules = endpoint_rules(
        rules_for(Settings().channels), RegistryRetryPolicies(table, gate.endpoint_of)
    )
    inside, outside = "https://hooks.acme.example/in/x", "https://other.example/in/x"
    assert rules("webhook", inside).max_attempts == 7  # nothing registered: the environment's
    three = RetryPolicy(base_delay_s=0.5, max_attempts=3)
    spec = EndpointSpec(channel="webhook", address="https://hooks.acme.example/in/")
    with_three = spec.model_copy(update={"retry_policy": three})
    added = register("acme", with_three, (), at=T0, existing=None, **WHO).endpoint
    table.put(added)
    assert rules("webhook", inside) == three
    assert rules("webhook", outside).max_attempts == 7  # not the endpoint's recipient
    two = three.model_copy(update={"max_attempts": 2})
    table.put(update(added, spec.model_copy(update={"retry_policy": two}), at=T0, **WHO).endpoint)
    assert rules("webhook", inside).max_attempts == 2  # the next decision, no restart
    table.put(update(added, spec, at=T0, **WHO).endpoint)
    assert rules("webhook", inside).max_attempts == 7  # no policy of its own: the fallback


def test_retry_or_fail_uses_the_policy_given_for_the_recipient() -> None:
    event = requested(0)
    state = applied(None, event)
    ctx = core_context()
    two = RetryPolicy(max_attempts=2)

    def rules(channel: str, recipient: str) -> RetryPolicy:
        return two if recipient == event.recipient else RetryPolicy(max_attempts=9)

    ctx = replace(ctx, rules=rules)
    at = event.occurred_at + timedelta(seconds=1)
    first = retry_or_fail(replace(state, attempt=1), ErrorClass.HTTP_5XX, "5xx", at, ctx)
    assert isinstance(first, DeliveryRetryScheduled)
    second = retry_or_fail(replace(state, attempt=2), ErrorClass.HTTP_5XX, "5xx", at, ctx)
    assert isinstance(second, DeliveryFailed)
    assert second.attempts == 2
