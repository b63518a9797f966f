"""Endpoint health (projections/health.py) on real events folded into both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.health_query import filled_projection, timed_health
from clients.endpoint_registry import append_endpoint_event
from config.settings import Settings
from events.endpoints import EndpointSpec, pause, register
from events.waiting import DeliveryHeld, WaitReason
from projections.backends import open_store
from projections.endpoint_owners import RecipientPrefix
from projections.health import (
    LATENCY_BOUNDS,
    OTHER,
    endpoint_health,
    quantile,
)
from projections.projector import rebuild
from streams.channels.endpoints import UrlPrefix
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import T0, P, at, incident_log, publish, requested


def held(n: int, run_id: str, t: float, reason: WaitReason) -> DeliveryHeld:
    req = requested(run_id, n, 100, slo=30)
    return DeliveryHeld(
        idempotency_key=req.idempotency_key,
        run_id=run_id,
        producer=P,
        reason=reason,
        detail="endpoint hooks paused by ana: maintenance",
        occurred_at=at(t),
    )


async def test_each_endpoint_has_its_ratio_latency_and_backlog(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    # The registry's "hooks" covers the webhook recipients /hooks/1 and /hooks/3 (n odd);
    # the provider recipients /hooks/2 and /hooks/4 are their own endpoints.
    added = register(
        "hooks",
        EndpointSpec(channel="webhook", address="http://127.0.0.1:9/hooks/"),
        (),
        actor="ana",
        producer=P,
        at=T0,
        existing=None,
    )
    await append_endpoint_event(settings.kafka, added)
    await append_endpoint_event(
        settings.kafka, pause(added.endpoint, "maintenance", actor="ana", producer=P, at=T0)
    )
    await publish(settings, [*incident_log(), held(1, "run-b", 101, WaitReason.PAUSED)])
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        report = endpoint_health(store, at(1800))
        by_name = {e.endpoint: e for e in report.endpoints}
        assert report.endpoints_total == 3
        hooks = by_name["hooks"]
        # a1 and c1 confirmed, a3 UNKNOWN: 2 of 3 attempts; each confirmed 3 s after its
        # request, in the (2, 3] bucket: p50 interpolates to 2.5.
        assert (hooks.source, hooks.state, hooks.breaker) == ("registry", "paused", "closed")
        assert hooks.attempts == {"1h": 3, "all": 3}
        assert hooks.success == {"1h": 0.6667, "all": 0.6667}
        assert hooks.latency["all"].count == 2
        assert hooks.latency["all"].p50 == 2.5
        assert hooks.latency["all"].p99 == 2.99
        # run-b's delivery waits for the paused endpoint, never attempted.
        assert (hooks.pending, hooks.waiting) == (1, {"paused": 1})
        retried = by_name["http://127.0.0.1:9/hooks/2"]  # a timeout, then confirmed
        assert (retried.channel, retried.source) == ("provider", "recipient")
        assert retried.success["all"] == 0.5
        assert retried.latency["all"].count == 1
        failed = by_name["http://127.0.0.1:9/hooks/4"]  # a 5xx, then a 4xx: FAILED
        assert failed.success["all"] == 0.0
        assert failed.latency["all"].p50 is None
        # Two hours on, the last hour holds nothing; all time is unchanged.
        later = {e.endpoint: e for e in endpoint_health(store, at(7200)).endpoints}
        assert later["hooks"].success == {"1h": None, "all": 0.6667}
        assert later["hooks"].latency["1h"].count == 0
        # The busiest first; the rest summed per channel.
        top = endpoint_health(store, at(1800), limit=1)
        assert [(e.endpoint, e.channel) for e in top.endpoints] == [
            ("hooks", "webhook"),
            (OTHER, "provider"),
        ]
        assert top.endpoints[1].attempts["all"] == 4
        assert top.endpoints[1].success["all"] == 0.25
    finally:
        store.close()


def test_quantiles_interpolate_within_a_bucket() -> None:
    buckets = [0] * (len(LATENCY_BOUNDS) + 1)
    assert quantile(0.5, buckets) is None
    buckets[LATENCY_BOUNDS.index(1)] = 10  # ten in (0.5, 1]
    assert quantile(0.5, buckets) == 0.75
    assert quantile(0.99, buckets) == 0.995
    buckets[-1] = 1000  # the open bucket answers its lower bound
    assert quantile(0.99, buckets) == LATENCY_BOUNDS[-1]


@pytest.mark.parametrize(
    ("prefix", "recipient"),
    [
        ("https://h.test/hooks/", "https://h.test/hooks/a"),
        ("https://h.test/hooks", "https://h.test/hooksevil"),
        ("https://h.test/hooks/", "https://h.test/hooks/%2e%2e/admin"),
        ("https://h.test/", "https://h.test.evil.test/x"),
        ("https://H.test:443/a", "https://h.test/a/b"),
        ("http://h.test:8080/a", "http://h.test/a"),
        ("https://h.test/a/", "https://u:p@h.test/a/b?x=1"),
    ],
)
def test_recipients_group_under_the_endpoint_the_worker_signs_for(
    prefix: str, recipient: str
) -> None:
    ours, theirs = RecipientPrefix.parse(prefix), UrlPrefix.parse(prefix)
    target, their_target = RecipientPrefix.parse(recipient), UrlPrefix.parse(recipient)
    assert ours is not None
    assert target is not None
    assert ours.covers(target) == theirs.covers(their_target)


def test_health_counts_right_at_100k_deliveries(tmp_path: Path) -> None:
    """Its speed is measured by bench/health_query.py (BENCHMARKS.md), not here."""
    _, report = timed_health(filled_projection(tmp_path / "big.sqlite3", 100_000), at(1800))
    assert report.endpoints_total == 199  # one per origin: the paths group under it
    assert sum(e.pending for e in report.endpoints) == 10_000
    assert sum(e.waiting.get("circuit_open", 0) for e in report.endpoints) == 5_000
    assert sum(e.attempts["all"] for e in report.endpoints) == 90_000
    assert {e.latency["all"].p50 for e in report.endpoints} == {
        4.0
    }  # all 4 s: the middle of (3, 5]
