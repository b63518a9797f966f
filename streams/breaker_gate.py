"""The breaker gate: an endpoint whose circuit is open holds its deliveries, and this
worker's sends decide when it opens and closes (the rule: streams/breaker_rule.py).

``hold`` answers for a delivery before its claim: while its endpoint's circuit is open, or
half-open and the delivery is not this worker's probe, it waits as ``circuit_open``, looked
at again every ``recheck_s``. When the rule says so, ``hold`` also appends the next
transition (half-open naming this delivery as the probe; auto-disable after a long outage)
in the background: it must not block, and the transition applies when the worker's
registry reads it back, like any other worker's. ``judge`` counts each of this worker's
sends (the sender calls it) and appends ``circuit_opened`` or ``circuit_closed``.

A transition is appended at most once per endpoint version this worker saw: until the
registry moves, asking again appends nothing. An append that fails is logged and tried
again at the next look.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta

from events.delivery_state import DeliveryState
from events.endpoints import (
    EndpointEvent,
    EndpointRefused,
    EndpointState,
    auto_disable,
    close_circuit,
    half_open_circuit,
    open_circuit,
)
from events.refusal import one_line
from events.waiting import WaitReason
from streams.breaker_rule import BreakerRule, SendWindow, Step, Verdict, verdict
from streams.channels.base import SendResult
from streams.endpoint_gate import Registry
from streams.gates import Hold, next_beat
from streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

AppendEndpointEvent = Callable[[EndpointEvent], Awaitable[None]]
EndpointOf = Callable[[str, str], str | None]
STATES = ("closed", "open", "half_open")


class BreakerGate:
    """Holds deliveries of endpoints whose circuit is open; opens and closes circuits."""

    def __init__(
        self,
        registry: Registry,
        endpoint_of: EndpointOf,
        rule: BreakerRule,
        append: AppendEndpointEvent,
        *,
        worker_id: str,
        producer: str,
        recheck_s: float = 1.0,
        enabled: bool = True,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._registry = registry
        self._endpoint_of = endpoint_of
        self._rule = rule
        self._append = append
        self._worker = worker_id
        self._producer = producer
        self._recheck = timedelta(seconds=recheck_s)
        self._enabled = enabled
        self._metrics = metrics
        self._windows: dict[str, SendWindow] = {}
        # (endpoint id, the version a transition was decided on): appended, or under way.
        self._decided: set[tuple[str, int]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _endpoint(self, state: DeliveryState) -> EndpointState | None:
        if not self._enabled or not self._registry.ready:
            return None  # an unread registry: the endpoint gate holds everything already
        endpoint_id = self._endpoint_of(state.channel, state.recipient)
        return None if endpoint_id is None else self._registry.endpoints.get(endpoint_id)

    def hold(self, state: DeliveryState, now: datetime) -> Hold | None:
        """A ``circuit_open`` hold while the delivery's endpoint is open (or half-open and
        this is not this worker's probe), else None."""
        endpoint = self._endpoint(state)
        if endpoint is None or endpoint.breaker is None:
            return None
        key = state.idempotency_key
        step = self._rule.step(endpoint, key, self._worker, now)
        if step is Step.CLAIM:
            return None
        if step is Step.PROBE:
            self._decide(
                endpoint,
                "half_open",
                lambda: half_open_circuit(
                    endpoint, probe=key, worker=self._worker, producer=self._producer, at=now
                ),
            )
        elif step is Step.AUTO_DISABLE:
            self._decide(endpoint, "auto_disabled", lambda: self._auto_disable(endpoint, now))
        breaker = endpoint.breaker
        detail = f"endpoint {endpoint.endpoint_id} circuit {breaker.state} since " + (
            f"{breaker.since.isoformat(timespec='seconds')}"
        )
        return Hold(next_beat(now, self._recheck), detail, WaitReason.CIRCUIT_OPEN)

    def judge(self, state: DeliveryState, result: SendResult, now: datetime) -> None:
        """Count one of this worker's sends; open or close its endpoint's circuit if the
        rule says so."""
        judged = verdict(result)
        endpoint = None if judged is None else self._endpoint(state)
        if endpoint is None or judged is None:
            return
        window = self._windows.setdefault(endpoint.endpoint_id, SendWindow(self._rule.window_s))
        window.add(now, judged is Verdict.FAILURE)
        since = None if endpoint.breaker is None else endpoint.breaker.since
        failures, sends = window.counts(now, since)
        key = state.idempotency_key
        step = self._rule.after_send(endpoint, key, judged, (failures, sends))
        if step == "close":
            self._decide(
                endpoint,
                "closed",
                lambda: close_circuit(endpoint, probe=key, producer=self._producer, at=now),
            )
        elif step == "open":
            probing = endpoint.circuit == "half_open"
            reason = (
                f"the probe {key} failed: {result.evidence}"
                if probing
                else f"{failures} of {sends} sends failed in {self._rule.window_s:g}s"
            )
            self._decide(
                endpoint,
                "open",
                lambda: open_circuit(
                    endpoint,
                    failures=failures,
                    sends=sends,
                    reason=reason[:1000],
                    producer=self._producer,
                    at=now,
                ),
            )

    def circuits(self) -> Iterator[tuple[Sequence[str], float]]:
        """(endpoint, state) -> 1 for each endpoint's current state, 0 for the others."""
        for endpoint_id, endpoint in sorted(self._registry.endpoints.items()):
            for name in STATES:
                yield (endpoint_id, name), float(endpoint.circuit == name)

    async def stop(self) -> None:
        """Wait for the transitions under way (bounded)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=10)

    def _auto_disable(self, endpoint: EndpointState, now: datetime) -> EndpointEvent:
        breaker = endpoint.breaker
        since = breaker.outage_since if breaker is not None else None
        reason = (
            f"circuit open since {since.isoformat(timespec='seconds') if since else '?'}, "
            f"longer than {self._rule.auto_disable_s:g}s"
        )
        event = auto_disable(endpoint, reason=reason, producer=self._producer, at=now)
        # The alert: an endpoint now waits for an operator.
        log.error(
            "endpoint %s disabled by the circuit breaker: %s; enable it with "
            "'ledger endpoints enable %s'",
            endpoint.endpoint_id,
            reason,
            endpoint.endpoint_id,
        )
        if self._metrics is not None:
            self._metrics.auto_disabled.labels(endpoint.endpoint_id).inc()
        return event

    def _decide(self, endpoint: EndpointState, to: str, make: Callable[[], EndpointEvent]) -> None:
        """Append ``make()`` in the background, once per endpoint version seen."""
        mark = (endpoint.endpoint_id, endpoint.version)
        if mark in self._decided:
            return
        try:
            event = make()
        except EndpointRefused:
            return  # the fold would ignore it: nothing to append
        self._decided.add(mark)
        task = asyncio.get_running_loop().create_task(self._appended(event, mark, to))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _appended(self, event: EndpointEvent, mark: tuple[str, int], to: str) -> None:
        try:
            await self._append(event)
        except Exception as exc:  # noqa: BLE001 - logged; decided again at the next look
            self._decided.discard(mark)
            log.warning(
                "could not append %s of endpoint %s: %s", event.TYPE, mark[0], one_line(exc)
            )
            return
        log.info("endpoint %s: circuit %s (%s)", mark[0], to, event.TYPE)
        if self._metrics is not None:
            self._metrics.circuit_transitions.labels(mark[0], to).inc()
