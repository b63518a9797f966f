"""The endpoint registry's vocabulary: every event carries the whole endpoint, the fold
keeps the newest version (so a compacted topic, a re-read or a duplicate folds alike), and
the decisions refuse what does not apply."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from events.codec import encode
from events.endpoints import (
    EndpointDecodeError,
    EndpointRefused,
    EndpointSecret,
    EndpointSpec,
    decode_endpoint_event,
    finish_rotation,
    fold,
    fold_all,
    pause,
    register,
    resume,
    rotate_secret,
    update,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = EndpointSpec(channel="webhook", address="https://hooks.test/acme/")
WHO = {"actor": "ana", "producer": "test"}


def secret(n: int, at: datetime = T0) -> EndpointSecret:
    return EndpointSecret(ciphertext=f"token-{n}", added_at=at)


def test_the_newest_version_wins_whatever_order_or_repetition() -> None:
    added = register("acme", SPEC, (secret(1),), at=T0, existing=None, **WHO)
    paused = pause(added.endpoint, "maintenance", at=T0 + timedelta(seconds=1), **WHO)
    resumed = resume(paused.endpoint, at=T0 + timedelta(seconds=2), **WHO)
    final = fold_all([added, paused, resumed])["acme"]
    assert final.state == "active"
    assert final.version == 3
    assert fold_all([resumed])["acme"] == final, "after compaction: the latest record alone"
    assert fold_all([added, resumed, paused, paused])["acme"] == final, "older ones change nothing"
    assert fold(final, decode_endpoint_event(encode(paused))) == final


def test_pause_records_who_why_and_when_and_refuses_twice() -> None:
    state = register("acme", SPEC, (), at=T0, existing=None, **WHO).endpoint
    paused = pause(state, "maintenance", at=T0, **WHO).endpoint
    assert paused.paused is not None
    assert (paused.state, paused.paused.by, paused.paused.reason) == (
        "paused",
        "ana",
        "maintenance",
    )
    with pytest.raises(EndpointRefused, match="paused already"):
        pause(paused, "again", at=T0, **WHO)
    with pytest.raises(EndpointRefused, match="is not paused"):
        resume(state, at=T0, **WHO)
    with pytest.raises(EndpointRefused, match="exists already"):
        register("acme", SPEC, (), at=T0, existing=state, **WHO)
    with pytest.raises(EndpointRefused, match="is a webhook endpoint"):
        update(state, SPEC.model_copy(update={"channel": "slack"}), at=T0, **WHO)


def test_a_rotation_keeps_the_old_secret_for_the_overlap_then_finishes() -> None:
    state = register("acme", SPEC, (secret(1),), at=T0, existing=None, **WHO).endpoint
    rotated = rotate_secret(state, secret(2, T0), timedelta(hours=1), at=T0, **WHO).endpoint
    assert [s.ciphertext for s in rotated.active_secrets(T0 + timedelta(minutes=59))] == [
        "token-1",
        "token-2",
    ]
    assert [s.ciphertext for s in rotated.active_secrets(T0 + timedelta(hours=1))] == ["token-2"]
    finished = finish_rotation(rotated, at=T0, **WHO)
    assert finished.finished
    assert [s.ciphertext for s in finished.endpoint.secrets] == ["token-2"]
    with pytest.raises(EndpointRefused, match="no rotation under way"):
        finish_rotation(finished.endpoint, at=T0, **WHO)


def test_a_record_that_is_not_an_endpoint_event_is_refused_in_one_line() -> None:
    with pytest.raises(EndpointDecodeError, match="tombstone"):
        decode_endpoint_event(None)
    with pytest.raises(EndpointDecodeError, match="not an endpoint event"):
        decode_endpoint_event(b'{"type": "endpoint.paused"}')
