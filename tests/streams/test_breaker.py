"""The circuit breaker, broker-free: the rule (window, minimum count, what counts), the
transitions and their fold (a duplicate changes nothing, the first of two racing workers
wins), and the gate (holds while open, one probe for one worker, auto-disable)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from events.codec import encode
from events.delivery_state import DeliveryState, apply
from events.endpoints import (
    EndpointAutoDisabled,
    EndpointCircuitClosed,
    EndpointCircuitHalfOpened,
    EndpointCircuitOpened,
    EndpointEvent,
    EndpointRefused,
    EndpointSpec,
    EndpointState,
    close_circuit,
    decode_endpoint_event,
    fold,
    fold_all,
    half_open_circuit,
    open_circuit,
    register,
)
from events.outcomes import ErrorClass
from events.waiting import WaitReason
from streams.breaker_gate import BreakerGate
from streams.breaker_rule import BreakerRule, SendWindow, Step, Verdict, verdict
from streams.channels.base import SendOutcome, SendResult
from streams.endpoint_gate import EndpointGate
from streams.metrics import WorkerMetrics
from tests.fixtures.core import requested

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULE = BreakerRule(window_s=60, min_sends=4, failure_ratio=0.5, open_s=30, auto_disable_s=3600)
SPEC = EndpointSpec(channel="webhook", address="https://hooks.example/")
WHO = {"producer": "test"}

OK = SendResult(SendOutcome.CONFIRMED, "200")
REFUSED = SendResult(SendOutcome.NOT_SENT, "refused", ErrorClass.CONNECT_REFUSED)
UNAVAILABLE = SendResult(SendOutcome.TRANSIENT, "503", ErrorClass.HTTP_5XX, 503)
REJECTED = SendResult(SendOutcome.REJECTED, "400", ErrorClass.HTTP_4XX, 400)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def endpoint() -> EndpointState:
    return register("acme", SPEC, (), actor="ana", producer="test", at=T0, existing=None).endpoint


def opened(state: EndpointState, at: datetime = T0) -> EndpointState:
    return open_circuit(state, failures=4, sends=4, reason="down", at=at, **WHO).endpoint


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (OK, Verdict.HEALTHY),
        (SendResult(SendOutcome.SENT, "queued"), Verdict.HEALTHY),
        (REJECTED, Verdict.HEALTHY),
        (REFUSED, Verdict.FAILURE),
        (SendResult(SendOutcome.NOT_SENT, "dns", ErrorClass.DNS_FAILURE), Verdict.FAILURE),
        (SendResult(SendOutcome.NOT_SENT, "t/o", ErrorClass.CONNECT_TIMEOUT), Verdict.FAILURE),
        (SendResult(SendOutcome.UNKNOWN, "reset", ErrorClass.RESET_AFTER_WRITE), Verdict.FAILURE),
        (SendResult(SendOutcome.UNKNOWN, "t/o", ErrorClass.TIMEOUT_AFTER_WRITE), Verdict.FAILURE),
        (UNAVAILABLE, Verdict.FAILURE),
        (SendResult(SendOutcome.TRANSIENT, "429", ErrorClass.HTTP_429, 429), Verdict.FAILURE),
        (SendResult(SendOutcome.NOT_SENT, "lease", ErrorClass.FENCED), None),
        (SendResult(SendOutcome.REJECTED, "too big", ErrorClass.REFUSED_REQUEST), None),
    ],
)
def test_what_a_send_says_about_its_endpoint(result: SendResult, expected: Verdict | None) -> None:
    assert verdict(result) is expected


def test_the_window_slides_and_starts_at_the_last_transition() -> None:
    window = SendWindow(60)
    for second in range(5):
        window.add(s(second), failed=second % 2 == 0)
    assert window.counts(s(5), None) == (3, 5)
    assert window.counts(s(62), None) == (2, 3), "sends older than the window are forgotten"
    assert window.counts(s(62), s(4)) == (1, 1), "what came before the transition was judged"


def test_the_rule_needs_the_minimum_count_and_the_ratio() -> None:
    assert not RULE.trips(3, 3), "three failures are fewer than the minimum count"
    assert RULE.trips(2, 4)
    assert not RULE.trips(1, 4)
    assert RULE.trips(10, 10)


def test_4xx_answers_never_open_a_circuit() -> None:
    window, state = SendWindow(60), endpoint()
    for i in range(20):
        judged = verdict(REJECTED)
        assert judged is not None
        window.add(s(i), judged is Verdict.FAILURE)
        assert RULE.after_send(state, f"k{i}", judged, window.counts(s(i), None)) is None


def test_open_then_one_probe_then_closed() -> None:
    state = opened(endpoint())
    assert RULE.step(state, "k1", "w1", s(10)) is Step.HOLD
    assert RULE.step(state, "k1", "w1", s(30)) is Step.PROBE
    half = half_open_circuit(state, probe="k1", worker="w1", at=s(30), **WHO).endpoint
    assert half.circuit == "half_open"
    assert RULE.step(half, "k1", "w1", s(31)) is Step.CLAIM, "the probe, by its own worker"
    assert RULE.step(half, "k1", "w2", s(31)) is Step.HOLD, "never by another worker"
    assert RULE.step(half, "k2", "w1", s(31)) is Step.HOLD, "one probe only"
    assert RULE.step(half, "k2", "w2", s(61)) is Step.PROBE, "a probe that never answered"
    assert RULE.after_send(half, "k2", Verdict.FAILURE, (9, 9)) is None, "not the probe"
    assert RULE.after_send(half, "k1", Verdict.FAILURE, (1, 1)) == "open"
    assert RULE.after_send(half, "k1", Verdict.HEALTHY, (0, 1)) == "close"
    closed = close_circuit(half, probe="k1", at=s(32), **WHO).endpoint
    assert closed.circuit == "closed"
    assert RULE.step(closed, "k2", "w2", s(32)) is Step.CLAIM
    with pytest.raises(EndpointRefused):
        close_circuit(half, probe="k2", at=s(32), **WHO)


def test_a_reopened_circuit_keeps_the_outage_start_and_disables_after_the_limit() -> None:
    state = opened(endpoint())
    half = half_open_circuit(state, probe="k1", worker="w1", at=s(30), **WHO).endpoint
    again = opened(half, s(31))
    assert again.breaker is not None
    assert again.breaker.outage_since == T0
    assert again.breaker.since == s(31)
    assert RULE.step(again, "k1", "w1", s(3600)) is Step.AUTO_DISABLE


def test_duplicates_and_racing_workers_fold_to_the_first_transition() -> None:
    base = endpoint()
    registered = register("acme", SPEC, (), actor="ana", producer="t", at=T0, existing=None)
    mine = open_circuit(base, failures=4, sends=4, reason="w1 saw it", at=s(1), producer="w1")
    theirs = open_circuit(base, failures=5, sends=6, reason="w2 saw it", at=s(2), producer="w2")
    assert mine.endpoint.version == theirs.endpoint.version == base.version + 1
    table = fold_all([registered, mine, theirs, mine])
    assert table["acme"] == mine.endpoint, "the first in the log wins; the rest change nothing"
    with pytest.raises(EndpointRefused):
        open_circuit(mine.endpoint, failures=4, sends=4, reason="again", at=s(3), **WHO)
    assert fold(mine.endpoint, mine) is mine.endpoint
    for event in (mine, theirs):
        assert decode_endpoint_event(encode(event)) == event


# -- the gate ------------------------------------------------------------------------------


@dataclass
class Registry:
    endpoints: dict[str, EndpointState] = field(default_factory=dict)
    version: int = 0
    ready: bool = True
    appended: list[EndpointEvent] = field(default_factory=list)

    async def append(self, event: EndpointEvent) -> None:
        """The log, read back at once."""
        self.appended.append(event)
        before = self.endpoints.get(event.endpoint_id)
        after = fold(before, event)
        if after is not before:
            self.endpoints[event.endpoint_id] = after
            self.version += 1


def gate_of(registry: Registry, worker: str, metrics: WorkerMetrics | None = None) -> BreakerGate:
    index = EndpointGate(registry)
    return BreakerGate(
        registry,
        index.endpoint_of,
        RULE,
        registry.append,
        worker_id=worker,
        producer=f"test/{worker}",
        recheck_s=1,
        metrics=metrics,
    )


def delivery(n: int) -> DeliveryState:
    state = apply(None, requested(n))
    assert state is not None
    return state


def circuit(registry: Registry) -> str:
    return registry.endpoints["acme"].circuit


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_gate_opens_holds_probes_once_and_closes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    registry.endpoints["acme"] = endpoint()
    metrics = WorkerMetrics()
    w1, w2 = gate_of(registry, "w1", metrics), gate_of(registry, "w2")
    first = [delivery(n) for n in range(3)]
    for i, d in enumerate(first):
        w1.judge(d, REFUSED, s(i))
    await settle()
    assert registry.appended == [], "three failures: under the minimum count"
    assert w1.hold(delivery(9), s(3)) is None
    w1.judge(delivery(3), UNAVAILABLE, s(3))
    w1.judge(delivery(4), UNAVAILABLE, s(3))  # decided already for this version
    await settle()
    assert [type(e) for e in registry.appended] == [EndpointCircuitOpened]
    held = w2.hold(delivery(9), s(4))
    assert held is not None
    assert held.reason is WaitReason.CIRCUIT_OPEN
    assert w2.hold(delivery(9), s(32)) is not None
    # After the open duration: each worker names one of its own deliveries, the first wins.
    assert w1.hold(delivery(5), s(33)) is not None
    assert w2.hold(delivery(6), s(33)) is not None
    assert w1.hold(delivery(7), s(33)) is not None  # same version seen: nothing more
    await settle()
    kinds = [type(e) for e in registry.appended]
    assert kinds == [EndpointCircuitOpened, EndpointCircuitHalfOpened, EndpointCircuitHalfOpened]
    probe = registry.endpoints["acme"].breaker
    assert probe is not None
    assert (probe.probe, probe.probe_worker) == (delivery(5).idempotency_key, "w1")
    assert w1.hold(delivery(5), s(34)) is None, "the probe goes, from its worker"
    assert w2.hold(delivery(6), s(34)) is not None, "w2's candidate lost the race: it waits"
    assert w1.hold(delivery(7), s(34)) is not None
    w1.judge(delivery(7), OK, s(34))  # a straggler: not the probe, judged nothing
    await settle()
    assert circuit(registry) == "half_open"
    w1.judge(delivery(5), OK, s(35))
    await settle()
    assert isinstance(registry.appended[-1], EndpointCircuitClosed)
    assert circuit(registry) == "closed"
    assert all(g.hold(delivery(n), s(36)) is None for g in (w1, w2) for n in range(9))
    # The failures before the closing are not counted again: one more does not reopen it.
    w1.judge(delivery(8), REFUSED, s(37))
    await settle()
    assert circuit(registry) == "closed"
    gauge = {labels[1]: value for labels, value in w1.circuits()}
    assert gauge == {"closed": 1.0, "open": 0.0, "half_open": 0.0}
    sample = metrics.registry.get_sample_value
    labels = {"endpoint": "acme", "to": "open"}
    assert sample("ledger_worker_endpoint_circuit_transitions_total", labels) == 1


async def test_a_failed_probe_reopens_and_a_long_outage_disables_with_an_alert(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    registry.endpoints["acme"] = opened(endpoint())
    registry.version = 1
    metrics = WorkerMetrics()
    w1 = gate_of(registry, "w1", metrics)
    w1.hold(delivery(1), s(30))
    await settle()
    w1.judge(delivery(1), REFUSED, s(31))
    await settle()
    state = registry.endpoints["acme"]
    assert state.circuit == "open"
    assert state.breaker is not None
    assert state.breaker.outage_since == T0
    with caplog.at_level(logging.ERROR):
        assert w1.hold(delivery(2), s(3600)) is not None
        await settle()
    assert isinstance(registry.appended[-1], EndpointAutoDisabled)
    state = registry.endpoints["acme"]
    assert state.state == "disabled"
    assert state.disabled is not None
    assert state.disabled.by == "circuit-breaker"
    assert state.circuit == "closed", "enabled again, it starts closed"
    assert any("disabled by the circuit breaker" in r.message for r in caplog.records)
    alerts = metrics.registry.get_sample_value(
        "ledger_worker_endpoint_auto_disabled_total", {"endpoint": "acme"}
    )
    assert alerts == 1
    held = EndpointGate(registry).hold(delivery(2), s(3601))
    assert held is not None
    assert held.reason is WaitReason.DISABLED, "its deliveries keep waiting, as disabled"


async def test_no_registered_endpoint_or_a_disabled_breaker_holds_nothing() -> None:
    registry = Registry()
    w1 = gate_of(registry, "w1")
    for n in range(20):
        w1.judge(delivery(n), REFUSED, s(n))
    await settle()
    assert registry.appended == []
    registry.endpoints["acme"] = opened(endpoint())
    off = BreakerGate(
        registry,
        EndpointGate(registry).endpoint_of,
        RULE,
        registry.append,
        worker_id="w",
        producer="t",
        enabled=False,
    )
    assert off.hold(delivery(1), s(1)) is None
