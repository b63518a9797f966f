"""The worker's live metrics, in Prometheus text format on 127.0.0.1 (opt-in by port).

Counters and the send-latency histogram are updated where things happen; gauges that
describe the present (consumer lag, due timers, sends in flight) are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

SEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class WorkerMetrics:
    """One registry per worker process (no global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "ledger_worker_events_processed",
            "Delivery events folded by this worker.",
            ["type"],
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "ledger_worker_dead_lettered",
            "Records sent to the dead-letter topic.",
            registry=self.registry,
        )
        self.timers_refused = Counter(
            "ledger_worker_timers_refused",
            "Timer decisions that raised for one key: that key's timer was dropped.",
            registry=self.registry,
        )
        self.sends = Counter(
            "ledger_worker_sends",
            "Send attempts by channel and outcome.",
            ["channel", "outcome"],
            registry=self.registry,
        )
        self.lookups = Counter(
            "ledger_worker_lookups",
            "Provider lookups by channel and outcome.",
            ["channel", "outcome"],
            registry=self.registry,
        )
        self.send_seconds = Histogram(
            "ledger_worker_send_seconds",
            "Time from request start to classified outcome.",
            ["channel"],
            buckets=SEND_BUCKETS,
            registry=self.registry,
        )
        self.timer_events = Counter(
            "ledger_worker_timer_events",
            "Events appended by timers (claims, lease expiries).",
            registry=self.registry,
        )
        # Timers must cost what is due, not what is open: this is how that is checked live.
        self.timer_tick_seconds = Histogram(
            "ledger_worker_timer_tick_seconds",
            "Duration of one timer tick (due-index scan and the decisions it triggers).",
            buckets=TICK_BUCKETS,
            registry=self.registry,
        )
        self.refused_sends = Counter(
            "ledger_worker_refused_sends",
            "Sends refused before the first byte (lease rule, revoked partition, shutdown).",
            ["reason"],
            registry=self.registry,
        )
        self.browser_restarts = Counter(
            "ledger_worker_browser_restarts",
            "Browsers of the browser channel relaunched after a crash or disconnect.",
            registry=self.registry,
        )
        self.skipped_recovered = Counter(
            "ledger_worker_skipped_records_recovered",
            "Committed records the stream skipped and the continuity guard re-read.",
            registry=self.registry,
        )
        self.circuit_transitions = Counter(
            "ledger_worker_endpoint_circuit_transitions",
            "Circuit-breaker transitions this worker appended, by endpoint and new state "
            "(open, half_open, closed, auto_disabled).",
            ["endpoint", "to"],
            registry=self.registry,
        )
        self.auto_disabled = Counter(
            "ledger_worker_endpoint_auto_disabled",
            "Endpoints this worker disabled after their circuit stayed open too long (an "
            "alert: an operator must look).",
            ["endpoint"],
            registry=self.registry,
        )

        self.rate_limit_holds = Counter(
            "ledger_worker_rate_limit_holds",
            "Claims held back for want of a rate-limit token (each time a delivery is asked "
            "and must wait; ledger_worker_rate_limited_waiting is how many wait now).",
            registry=self.registry,
        )
        self.rate_paced_sends = Counter(
            "ledger_worker_rate_paced_sends",
            "Claimed sends that waited at the hand-off for their endpoint's pace "
            "(streams/send_pacer.py; ledger_worker_rate_paced_waiting is how many wait now).",
            registry=self.registry,
        )

    def watch(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge whose value is read at scrape time."""
        self.registry.register(_LiveGauge(name, help_text, read))

    def watch_labeled(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        read: Callable[[], Iterable[tuple[Sequence[str], float]]],
    ) -> None:
        """A gauge with labels, its (label values, value) pairs read at scrape time."""
        self.registry.register(_LabeledGauge(name, help_text, labels, read))

    def serve(self, host: str, port: int) -> None:
        """Expose /metrics on ``host:port`` (a daemon thread)."""
        start_http_server(port, addr=host, registry=self.registry)


class _LiveGauge(Collector):
    def __init__(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self._name = name
        self._help = help_text
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._help, value=float(self._read()))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._help)


class _LabeledGauge(Collector):
    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str],
        read: Callable[[], Iterable[tuple[Sequence[str], float]]],
    ) -> None:
        self._name = name
        self._help = help_text
        self._labels = list(labels)
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._help, labels=self._labels)
        for values, value in self._read():
            family.add_metric(list(values), float(value))
        yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._help, labels=self._labels)
