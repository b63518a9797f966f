"""Prometheus metrics from the projection and the log: every dashboard number and the
worker-side numbers the ledger tables (and the topics' end offsets) can answer.

The worker's live numbers (send latency, consumer lag, due timers) are the worker's own
endpoint; here everything is derived, so any process with the projection can serve it.
A scrape builds a fresh registry from one snapshot: nothing is kept between scrapes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from clients.committed_log import CommittedLog
from config.settings import Settings
from events.endpoints import BREAKER_ACTOR
from projections import queries
from projections.budget_metrics import budget_families
from projections.budgets import BudgetUse, budget_use
from projections.dashboard.overview import COUNTERS, Overview, overview
from projections.fold import Row
from projections.health import METRIC_ENDPOINTS, HealthReport, endpoint_health
from projections.queries import AggregateCache
from projections.store import Store

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ProjectionNumbers:
    """What the tables say beyond the dashboard page."""

    overview: Overview
    runs_by_status: dict[str, int]
    sends: list[tuple[str, str, int]]  # channel, outcome, count
    open_leases: int
    awaiting_retry: int
    consumed: dict[str, int]  # topic -> records consumed (sum of next offsets)
    health: HealthReport | None = None
    budgets: list[BudgetUse] = field(default_factory=list)
    stopped: list[StoppedEndpoint] = field(default_factory=list)


@dataclass(frozen=True)
class StoppedEndpoint:
    """A registered endpoint that is paused or disabled, and for how long (every one of
    them, not only the busiest: a stopped endpoint may have no traffic left to rank by)."""

    channel: str
    endpoint: str
    state: str  # paused | disabled
    by: str  # circuit-breaker (auto-disabled) | operator
    seconds: float


def stopped_endpoints(registry: Iterable[Row], now: datetime) -> list[StoppedEndpoint]:
    """The paused and disabled endpoints of ``queries.endpoints``' rows, as of ``now``."""
    return [
        StoppedEndpoint(
            channel=r["channel"],
            endpoint=r["endpoint_id"],
            state=r["state"],
            by="circuit-breaker" if r["stopped_by"] == BREAKER_ACTOR else "operator",
            seconds=queries.age_seconds(r["stopped_at"], now) if r["stopped_at"] else 0.0,
        )
        for r in registry
        if r["state"] != "active"
    ]


@dataclass
class LogNumbers:
    """What the topics' end offsets say (read_committed); ``up`` False when Kafka is away."""

    up: bool = False
    end_offsets: dict[str, int] = field(default_factory=dict)


def projection_numbers(
    store: Store,
    now: datetime,
    configured: dict[str, int],
    cache: AggregateCache | None = None,
    settings: Settings | None = None,
) -> ProjectionNumbers:
    """Read the projection once for a scrape (``settings``: the configured webhook
    endpoints, which group recipients for the endpoint series)."""
    page = overview(store, now, configured, limit=0, cache=cache)
    store.begin_read()
    try:
        memo = cache or AggregateCache()
        rest = memo.get(store, ("metrics",), lambda: _log_side(store))
        registry = memo.get(store, ("endpoints",), lambda: queries.endpoints(store))
        budgets = budget_use(store, now)
    finally:
        store.rollback()
    prefixes = list(settings.channels.webhook_endpoints) if settings else []
    health = endpoint_health(store, now, prefixes, METRIC_ENDPOINTS, cache)
    stopped = stopped_endpoints(registry, now)
    return ProjectionNumbers(page, *rest, health=health, budgets=budgets, stopped=stopped)


def _log_side(
    store: Store,
) -> tuple[dict[str, int], list[tuple[str, str, int]], int, int, dict[str, int]]:
    return (
        queries.runs_by_status(store),
        queries.sends_by_outcome(store),
        queries.open_leases(store),
        queries.awaiting_retry(store),
        queries.consumed_offsets(store),
    )


class LogWatcher:
    """End offsets of the ledger topics over one long-lived reader (cheap per scrape)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._log = CommittedLog(settings.kafka, request_timeout_ms=5000)

    async def numbers(self) -> LogNumbers:
        """Sum of end offsets per topic; ``up=False`` (and no numbers) if Kafka does not answer."""
        try:
            await self._log.start()
            ends: dict[str, int] = {}
            for topic in self._settings.kafka.topic_names():
                tps = await self._log.partitions(topic, missing_ok=True)
                if not tps:
                    continue
                found = await self._log.ends(tps)
                start = await self._log.beginnings(tps)
                ends[topic] = sum(found[tp] - start[tp] for tp in tps)
        except Exception as exc:  # noqa: BLE001 - any Kafka trouble is "log not reachable"
            log.warning("metrics: Kafka end offsets unavailable: %s", exc)
            await self.stop()
            return LogNumbers()
        return LogNumbers(True, ends)

    async def stop(self) -> None:
        """Disconnect (a later ``numbers`` reconnects)."""
        await self._log.stop()


def families(p: ProjectionNumbers, k: LogNumbers, settings: Settings) -> Iterator[Metric]:
    """The metric families of one scrape."""
    page = p.overview
    titles = {name: title for name, title, _ in COUNTERS}
    for c in page.counters:
        gauge = GaugeMetricFamily(f"ledger_{_counter_metric(c.name)}", titles[c.name])
        gauge.add_metric([], c.value)
        yield gauge
    threshold = GaugeMetricFamily(
        "ledger_dashboard_threshold", "The value at which a dashboard counter turns red",
        labels=["counter"],
    )  # fmt: skip
    for c in page.counters:
        threshold.add_metric([c.name], c.threshold)
    yield threshold
    # Beside the past-SLO counters: the backlog now, so a burst shows before it is late.
    backlog = page.backlog
    pending = GaugeMetricFamily(
        "ledger_pending_deliveries", "PENDING deliveries now, within their SLO or past it"
    )
    pending.add_metric([], backlog.pending_now)
    yield pending
    oldest = GaugeMetricFamily(
        "ledger_oldest_pending_delivery_age_seconds",
        "Seconds since the oldest PENDING delivery was requested (0: none pending)",
    )
    oldest.add_metric([], backlog.oldest_age_seconds)
    yield oldest
    yield _labelled(
        "ledger_pending_deliveries_by_channel",
        "PENDING deliveries now, by channel",
        ["channel"],
        [((c.channel,), c.pending) for c in backlog.by_channel],
    )
    yield _labelled(
        "ledger_deliveries",
        "Deliveries by current state",
        ["status"],
        [((s,), n) for s, n in page.deliveries_by_status.items()],
    )
    yield _labelled(
        "ledger_runs",
        "Agent runs by execution state",
        ["status"],
        [((s,), n) for s, n in sorted(p.runs_by_status.items())],
    )
    yield _labelled(
        "ledger_attempts",
        "Delivery attempts by channel and error class ('none': no error)",
        ["channel", "error_class"],
        [
            ((r["channel"], r["error_class"] or "none"), r["attempts"])
            for r in page.attempts_by_channel
        ],
    )
    yield _labelled(
        "ledger_sends",
        "Attempts that reached an outcome, by channel and outcome",
        ["channel", "outcome"],
        [((ch, out), n) for ch, out, n in p.sends],
    )
    for name, help_text, value in (
        ("ledger_open_leases", "Deliveries currently CLAIMED (lease open, no outcome)",
         p.open_leases),
        ("ledger_deliveries_awaiting_retry", "PENDING deliveries with a retry scheduled",
         p.awaiting_retry),
        ("ledger_deliveries_awaiting_reconciliation", "UNKNOWN deliveries awaiting a lookup",
         page.deliveries_by_status["UNKNOWN"]),
    ):  # fmt: skip
        gauge = GaugeMetricFamily(name, help_text)
        gauge.add_metric([], value)
        yield gauge
    yield from _operator_families(page)
    if p.health is not None:
        yield from health_families(p.health)
    yield _stopped_family(p.stopped)
    yield from budget_families(p.budgets)
    lat = page.latency
    cumulative, buckets = 0, []
    for bound, n in zip([*lat["bounds"], float("inf")], lat["counts"], strict=True):
        cumulative += n
        buckets.append(("+Inf" if bound == float("inf") else f"{bound:g}", cumulative))
    hist = HistogramMetricFamily(
        "ledger_delivery_latency_seconds", "Requested to confirmed, CONFIRMED deliveries"
    )
    hist.add_metric([], buckets, sum_value=lat["sum_seconds"])
    yield hist
    # Offsets, not events: a transactional writer leaves one commit marker per
    # transaction in the log, so end offsets run ahead of the records they hold.
    consumed = GaugeMetricFamily(
        "ledger_projection_offset",
        "Sum over partitions of the next offset the projection will read, per topic",
        labels=["topic"],
    )
    for topic, n in sorted(p.consumed.items()):
        consumed.add_metric([topic], n)
    yield consumed
    up = GaugeMetricFamily("ledger_log_up", "1 when Kafka answered the end-offset request")
    up.add_metric([], 1 if k.up else 0)
    yield up
    if k.up:
        ends = GaugeMetricFamily(
            "ledger_log_end_offset",
            "Sum over partitions of the last stable offset, per ledger topic",
            labels=["topic"],
        )
        for topic, n in sorted(k.end_offsets.items()):
            ends.add_metric([topic], n)
        yield ends
        dead = GaugeMetricFamily(
            "ledger_deadletter_records",
            "Dead-lettered records (end offsets of the dead-letter topic; a transactional "
            "writer adds one marker per transaction)",
        )
        dead.add_metric([], k.end_offsets.get(settings.kafka.topic_deadletter, 0))
        yield dead


def _operator_families(page: Overview) -> Iterator[Metric]:
    """Operators' actions (counters: the log only grows) and the oldest UNKNOWN's age."""
    ops = page.operators
    settled = CounterMetricFamily(
        "ledger_operator_settled_total",
        "Deliveries an operator settled with 'ledger resolve', by outcome (applied only)",
        labels=["outcome"],
    )
    for outcome, n in ops.settled.items():
        settled.add_metric([outcome], n)
    yield settled
    redrives = CounterMetricFamily(
        "ledger_redrives_total",
        "Operators' redrives, by result (refused: wrong state or stale)",
        labels=["result"],
    )
    for result, n in ops.redrives.items():
        redrives.add_metric([result], n)
    yield redrives
    oldest = GaugeMetricFamily(
        "ledger_oldest_unknown_age_seconds",
        "Seconds since the oldest UNKNOWN delivery became UNKNOWN (0: none unknown)",
    )
    oldest.add_metric([], ops.oldest_unknown_age_seconds)
    yield oldest


def _stopped_family(stopped: list[StoppedEndpoint]) -> Metric:
    family = GaugeMetricFamily(
        "ledger_endpoint_stopped_seconds",
        "Seconds since a registered endpoint was paused or disabled, per endpoint, state "
        "(paused, disabled) and by whom (circuit-breaker: auto-disabled; operator); "
        "absent while it is active",
        labels=["channel", "endpoint", "state", "by"],
    )
    for e in stopped:
        family.add_metric([e.channel, e.endpoint, e.state, e.by], e.seconds)
    return family


def health_families(report: HealthReport) -> Iterator[Metric]:
    """Per endpoint (the ``METRIC_ENDPOINTS`` busiest, the rest summed per channel as
    endpoint="(other)": bounded cardinality) and per agent."""
    labels = ["channel", "endpoint"]
    ratio = GaugeMetricFamily(
        "ledger_endpoint_success_ratio",
        "Attempts that ended SENT or CONFIRMED over attempts that reached an outcome, per "
        "endpoint and window (1h, all); absent while none ended",
        labels=[*labels, "window"],
    )
    ended = GaugeMetricFamily(
        "ledger_endpoint_attempts",
        "Attempts that reached an outcome, per endpoint and window (1h, all)",
        labels=[*labels, "window"],
    )
    latency = GaugeMetricFamily(
        "ledger_endpoint_latency_seconds",
        "Requested to confirmed, per endpoint, window (1h, all) and quantile (histogram "
        "quantile over projections.health.LATENCY_BOUNDS); absent while none confirmed",
        labels=[*labels, "window", "quantile"],
    )
    pending = GaugeMetricFamily(
        "ledger_endpoint_pending", "PENDING deliveries now, per endpoint", labels=labels
    )
    waiting = GaugeMetricFamily(
        "ledger_endpoint_waiting",
        "PENDING deliveries held back now, per endpoint and reason",
        labels=[*labels, "reason"],
    )
    status = GaugeMetricFamily(
        "ledger_endpoint_status",
        "1 per endpoint, with its registry state and its circuit breaker's state",
        labels=[*labels, "state", "breaker"],
    )
    for e in report.endpoints:
        at = [e.channel, e.endpoint]
        for window, value in e.success.items():
            ended.add_metric([*at, window], e.attempts[window])
            if value is not None:
                ratio.add_metric([*at, window], value)
        for window, lat in e.latency.items():
            for q, v in (("0.5", lat.p50), ("0.99", lat.p99)):
                if v is not None:
                    latency.add_metric([*at, window, q], v)
        pending.add_metric(at, e.pending)
        for reason, n in e.waiting.items():
            waiting.add_metric([*at, reason], n)
        status.add_metric([*at, e.state, e.breaker], 1)
    yield from (ratio, ended, latency, pending, waiting, status)
    if report.agents is not None:
        held = GaugeMetricFamily(
            "ledger_agent_budget_held",
            "PENDING deliveries held over their agent's send budget, per agent",
            labels=["agent"],
        )
        requested = GaugeMetricFamily(
            "ledger_agent_requested_1h",
            "Deliveries an agent asked for in the last hour",
            labels=["agent"],
        )
        for a in report.agents:
            held.add_metric([a.agent], a.held)
            requested.add_metric([a.agent], a.requested_1h)
        yield held
        yield requested


def _counter_metric(name: str) -> str:
    return {
        "overdue_pending": "overdue_pending_deliveries",
        "overdue_sent": "overdue_sent_deliveries",
        "unknown": "unknown_deliveries",
        "confirmed_without_result": "confirmed_without_result_deliveries",
        "duplicate_conflicts": "duplicate_key_conflicts",
        "failed_attempts": "failed_attempts",
    }[name]


def _labelled(
    name: str, help_text: str, labels: list[str], values: Iterable[tuple[tuple[str, ...], int]]
) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, help_text, labels=labels)
    for label_values, n in values:
        gauge.add_metric(list(label_values), n)
    return gauge


class _Snapshot(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def exposition(p: ProjectionNumbers, k: LogNumbers, settings: Settings) -> bytes:
    """The Prometheus text format of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(list(families(p, k, settings))))
    return generate_latest(registry)
