"""``/metrics`` parses as Prometheus text and says what the projection and the log say."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from clients.endpoint_registry import append_endpoint_event
from events.endpoints import (
    EndpointSpec,
    auto_disable,
    half_open_circuit,
    open_circuit,
    pause,
    register,
)
from projections import status_report
from tests.dashboard.conftest import NOW, Stack, project_all
from tests.deploy.alert_rules import FREE_LABELS, input_series, metric_names, rules
from tests.projections.scenarios import T0, at, found_later, requested

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(stack: Stack) -> Samples:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


async def test_metrics_match_the_projection_and_the_log(stack: Stack) -> None:
    settings = stack.settings
    # Two undecodable records, dead-lettered by a plain (non-transactional) producer.
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for n in range(2):
            await producer.send_and_wait(
                settings.kafka.topic_deadletter, b"{}", key=f"bad-{n}".encode()
            )
    finally:
        await producer.stop()

    m = await scrape(stack)
    store = stack.read()
    try:
        report = status_report(store, NOW)
        consumed = {
            r["topic"]: r["n"]
            for r in store.rows(
                "SELECT topic, SUM(next_offset) AS n FROM projection_offsets GROUP BY topic"
            )
        }
    finally:
        store.close()
    assert m[("ledger_overdue_pending_deliveries", ())] == len(report.overdue_pending) == 1
    assert m[("ledger_pending_deliveries", ())] == report.backlog.pending_now == 1
    assert m[("ledger_oldest_pending_delivery_age_seconds", ())] == 3500.0  # NOW - T0+100s
    assert m[("ledger_pending_deliveries_by_channel", (("channel", "webhook"),))] == 1
    assert m[("ledger_overdue_sent_deliveries", ())] == len(report.overdue_sent) == 0
    assert m[("ledger_unknown_deliveries", ())] == len(report.unknown) == 1
    assert m[("ledger_confirmed_without_result_deliveries", ())] == 1
    assert m[("ledger_duplicate_key_conflicts", ())] == len(report.duplicate_conflicts) == 1
    assert m[("ledger_failed_attempts", ())] == 4
    assert m[("ledger_dashboard_threshold", (("counter", "failed_attempts"),))] == 25
    for status, n in {"PENDING": 1, "SENT": 0, "UNKNOWN": 1, "CONFIRMED": 3, "FAILED": 1}.items():
        assert m[("ledger_deliveries", (("status", status),))] == n
    assert m[("ledger_runs", (("status", "SUCCEEDED"),))] == 2
    assert m[("ledger_runs", (("status", "RUNNING"),))] == 1
    for row in report.attempts_by_channel:
        if row["error_class"] is not None:  # one outcome per error class in this scenario
            labels = (("channel", row["channel"]), ("error_class", row["error_class"]))
            assert m[("ledger_attempts", labels)] == row["attempts"]
    assert m[("ledger_attempts", (("channel", "webhook"), ("error_class", "none")))] == 2
    assert m[("ledger_sends", (("channel", "provider"), ("outcome", "RETRY")))] == 2
    assert m[("ledger_open_leases", ())] == 0
    assert m[("ledger_deliveries_awaiting_retry", ())] == 0
    assert m[("ledger_deliveries_awaiting_reconciliation", ())] == 1
    assert m[("ledger_delivery_latency_seconds_count", ())] == 3
    assert m[("ledger_delivery_latency_seconds_bucket", (("le", "5"),))] == 2
    assert m[("ledger_delivery_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    assert abs(m[("ledger_delivery_latency_seconds_sum", ())] - 19.0) < 0.01
    assert m[("ledger_log_up", ())] == 1
    assert m[("ledger_deadletter_records", ())] == 2
    for topic in (settings.kafka.topic_runs, settings.kafka.topic_deliveries):
        assert m[("ledger_projection_offset", (("topic", topic),))] == consumed[topic]
        # One transaction: each partition it wrote to ends with one commit marker.
        ends = m[("ledger_log_end_offset", (("topic", topic),))]
        assert consumed[topic] < ends <= consumed[topic] + settings.kafka.partitions


async def test_open_leases_and_retries_follow_new_events(stack: Stack) -> None:
    from events import DeliveryClaimed, DeliveryRetryScheduled

    b1 = requested("run-b", 1, 100, slo=30)
    common = {"idempotency_key": b1.idempotency_key, "run_id": "run-b", "producer": "test"}
    claim = DeliveryClaimed(
        **common, attempt=1, worker_id="w9", fencing_token=1,
        lease_expires_at=at(330), occurred_at=at(300),
    )  # fmt: skip
    await stack.append([claim])
    m = await scrape(stack)
    assert m[("ledger_open_leases", ())] == 1
    assert m[("ledger_overdue_pending_deliveries", ())] == 1  # claimed is still PENDING
    retry = DeliveryRetryScheduled(
        **common, attempt=1, next_attempt=2, retry_at=at(400), error_class="connect_refused",
        safety="nothing was written", occurred_at=at(301),
    )  # fmt: skip
    await stack.append([retry])
    m = await scrape(stack)
    assert m[("ledger_open_leases", ())] == 0
    assert m[("ledger_deliveries_awaiting_retry", ())] == 1
    assert m[("ledger_sends", (("channel", "webhook"), ("outcome", "RETRY")))] == 1
    assert m[("ledger_failed_attempts", ())] == 5


async def test_sent_past_its_slo_is_a_metric(stack: Stack) -> None:
    a3 = requested("run-a", 3, 1)  # UNKNOWN; its SLO ended at T0+61s, long before NOW
    await stack.append([found_later(a3, 300)])
    m = await scrape(stack)
    assert m[("ledger_overdue_sent_deliveries", ())] == 1
    assert m[("ledger_dashboard_threshold", (("counter", "overdue_sent"),))] == 1
    assert m[("ledger_deliveries", (("status", "SENT"),))] == 1
    assert m[("ledger_unknown_deliveries", ())] == 0


async def test_stopped_endpoints_and_heartbeats_are_metrics_the_alert_rules_read(
    stack: Stack,
) -> None:
    """An endpoint paused by an operator and one disabled by its breaker, each with how
    long; the workers heartbeating; and every metric, label and label value the shipped
    alert rules and their promtool tests use is one this scrape writes."""
    kafka = stack.settings.kafka
    spec = EndpointSpec(channel="webhook", address="https://hooks.test/acme/")
    acme = register("acme", spec, (), actor="ana", producer="test", at=T0, existing=None)
    paused = pause(acme.endpoint, "maintenance", actor="ana", producer="test", at=T0)
    spec = EndpointSpec(channel="webhook", address="https://hooks.test/down/")
    down = register("down", spec, (), actor="ana", producer="test", at=T0, existing=None)
    later = T0 + timedelta(minutes=30)
    tripped = open_circuit(
        down.endpoint, failures=10, sends=10, reason="503s", producer="test", at=later
    )
    stopped = auto_disable(tripped.endpoint, reason="open too long", producer="test", at=later)
    # And the breaker's other states: open (acme, paused too), half-open (a probe).
    acme_open = open_circuit(
        paused.endpoint, failures=10, sends=10, reason="503s", producer="test", at=later
    )
    spec = EndpointSpec(channel="webhook", address="https://hooks.test/probed/")
    probed = register("probed", spec, (), actor="ana", producer="test", at=T0, existing=None)
    probed_open = open_circuit(
        probed.endpoint, failures=10, sends=10, reason="503s", producer="test", at=later
    )
    probing = half_open_circuit(
        probed_open.endpoint, probe="k" * 64, worker="w1", producer="test", at=later
    )
    events = (acme, paused, down, tripped, stopped, acme_open, probed, probed_open, probing)
    for event in events:
        await append_endpoint_event(kafka, event)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        beat = {"worker_id": "w1", "clock_offset_s": 0.1, "clock_skew": False, "acting": True}
        value = json.dumps({**beat, "why_not": None}).encode()
        await producer.send_and_wait(kafka.topic_heartbeats, value, key=b"w1")
    finally:
        await producer.stop()
    await project_all(stack.settings, stack.dsn)

    m = await scrape(stack)
    stopped_at = "ledger_endpoint_stopped_seconds"
    acme_labels = (("by", "operator"), ("channel", "webhook"), ("endpoint", "acme"))
    assert m[(stopped_at, (*acme_labels, ("state", "paused")))] == 3600.0  # NOW - T0
    down_labels = (("by", "circuit-breaker"), ("channel", "webhook"), ("endpoint", "down"))
    assert m[(stopped_at, (*down_labels, ("state", "disabled")))] == 1800.0
    assert len([k for k in m if k[0] == stopped_at]) == 2
    assert m[("ledger_workers_heartbeating", ())] == 1
    assert m[("ledger_worker_clock_skew", (("worker", "w1"),))] == 0

    written: dict[str, dict[str, set[str]]] = {}
    for name, pairs in m:
        for label, label_value in pairs:
            written.setdefault(name, {}).setdefault(label, set()).add(label_value)
        written.setdefault(name, {})
    for rule in rules():
        assert metric_names(rule["expr"]) <= set(written), rule["alert"]
    for name, series_labels in input_series():
        if name == "up" or series_labels.get("job") == "ledger-worker":
            continue  # written by Prometheus, or by a worker's own /metrics
        assert name in written, name
        assert set(series_labels) - {"job", "instance"} == set(written[name]), name
        for label, label_value in series_labels.items():
            if label not in FREE_LABELS:
                assert label_value in written[name][label], (name, label, label_value)
