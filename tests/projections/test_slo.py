"""The SLO a delivery is judged by: its registered endpoint's where the registry sets one
(wins over the request's, smaller or larger), else the request's; an update applies at the
next question; on both backends, from a real broker's log."""

from __future__ import annotations

from clients.endpoint_registry import append_endpoint_event
from config.settings import Settings
from events.endpoints import EndpointSpec, register, update
from projections.backends import open_store
from projections.projector import rebuild
from projections.queries import overdue_counts, overdue_pending, overdue_sent, status_report
from projections.store import Store
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import T0, P, at, publish, requested

HOOKS = "http://127.0.0.1:9/hooks/"
WHO = {"actor": "ana", "producer": P}


async def projected(settings: Settings, dsn_factory: DsnFactory) -> Store:
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    return store


def late(store: Store, seconds: float, limit: int | None = None) -> list[tuple[str, str]]:
    rows = overdue_pending(store, at(seconds), limit)
    counts = overdue_counts(store, at(seconds))
    if limit is None:
        assert counts["overdue_pending"] == len(rows), "the counter counts the listed rows"
    assert overdue_sent(store, at(seconds)) == []
    return [(r["idempotency_key"], r["slo_deadline"]) for r in rows]


async def test_a_registered_endpoints_slo_wins_over_the_requests(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    d1 = requested("run-s", 1, 0, slo=600)  # webhook .../hooks/1: under "hooks"
    d3 = requested("run-s", 3, 0, slo=30)  # webhook .../hooks/3: under "hooks"
    d5 = requested("run-s", 5, 0, slo=30)  # webhook .../hooks/5: "five", which has no SLO
    d2 = requested("run-s", 2, 0, slo=30)  # provider: no endpoint
    hooks = register(
        "hooks",
        EndpointSpec(channel="webhook", address=HOOKS, slo_s=120),
        (),
        at=T0,
        existing=None,
        **WHO,
    )
    five = register(
        "five",
        EndpointSpec(channel="webhook", address=f"{HOOKS}5"),
        (),
        at=T0,
        existing=None,
        **WHO,
    )
    for event in (hooks, five):
        await append_endpoint_event(settings.kafka, event)
    await publish(settings, [d1, d3, d5, d2])

    def due(seconds: int) -> str:
        return (T0.replace(microsecond=0) + (at(seconds) - T0)).strftime(
            "%Y-%m-%dT%H:%M:%S.000000Z"
        )

    own = sorted([(d2.idempotency_key, due(30)), (d5.idempotency_key, due(30))])
    registry = sorted([(d1.idempotency_key, due(120)), (d3.idempotency_key, due(120))])
    store = await projected(settings, dsn_factory)
    try:
        # At 60 s: d3's request says late (30 s), its endpoint says not yet (120 s).
        assert late(store, 60) == own
        # At 121 s: d1's request says not yet (600 s), its endpoint says late.
        assert late(store, 121) == own + registry
        assert late(store, 121, limit=3) == (own + registry)[:3]
        assert [r["idempotency_key"] for r in status_report(store, at(121)).overdue_pending] == [
            k for k, _ in own + registry
        ]
    finally:
        store.close()

    # The endpoint's SLO raised to 1000 s: the next question follows it, for deliveries
    # requested before the change too (d1's own 600 s no longer counts).
    changed = update(
        hooks.endpoint, EndpointSpec(channel="webhook", address=HOOKS, slo_s=1000), at=T0, **WHO
    )
    await append_endpoint_event(settings.kafka, changed)
    store = await projected(settings, dsn_factory)
    try:
        assert late(store, 121) == own
        assert late(store, 700) == own
        assert late(store, 1001) == own + sorted(
            [(d1.idempotency_key, due(1000)), (d3.idempotency_key, due(1000))]
        )
    finally:
        store.close()
