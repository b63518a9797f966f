"""The workers' heartbeats in Prometheus' text format (projections/heartbeats.py)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from projections.heartbeats import WorkerClock, clock_exposition


def samples(text: bytes) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_the_count_of_workers_is_absent_when_the_heartbeats_cannot_be_read() -> None:
    """Zero workers fires an alert (deploy/prometheus/ledger-alerts.yml); an unreadable
    topic must not look like zero."""
    clock = WorkerClock("w1", 0.2, clock_skew=False, acting=True, why_not=None, seen_at="")
    assert samples(clock_exposition([clock]))["ledger_workers_heartbeating"] == 1
    assert samples(clock_exposition([]))["ledger_workers_heartbeating"] == 0
    assert "ledger_workers_heartbeating" not in samples(clock_exposition([], read=False))
