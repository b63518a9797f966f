"""Retry-After parsing: delay-seconds, HTTP dates relative to now, nonsense ignored."""

from email.utils import formatdate

from streams.channels.outcomes import retry_after_seconds

NOW = 1_700_000_000.0


def test_retry_after_forms() -> None:
    assert retry_after_seconds("120", lambda: NOW) == 120.0
    assert retry_after_seconds(formatdate(NOW + 30, usegmt=True), lambda: NOW) == 30.0
    assert retry_after_seconds(formatdate(NOW - 30, usegmt=True), lambda: NOW) == 0.0
    assert retry_after_seconds("-5", lambda: NOW) is None
    assert retry_after_seconds("soon", lambda: NOW) is None
    assert retry_after_seconds(None) is None
