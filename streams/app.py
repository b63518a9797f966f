"""The faust-streaming app of ``ledger worker``, built by ``create_app(settings)``.

One agent consumes ``ledger.deliveries`` (read_committed, at-least-once) and folds each
record into a rocksdict-backed table with a changelog; another fans out the deliveries
carried by run records of ``ledger.runs`` (the publisher's record mode, streams/fan_out.py).
Claims and dead letters are appended from the agents; the sender and the timers run beside
them and append outcomes with a separate idempotent producer. Every append may be seen
more than once, so the fold dedupes by event_id and fences by token. ``Worker`` wires the
pieces and owns the handlers faust calls: assignment, revocation, recovery, the tick and
shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

from aiokafka.errors import KafkaError
from faust.types import TP
from mode import CrashingSupervisor

from clients.committed_log import TRANSIENT
from clients.endpoint_registry import EndpointRegistry, append_endpoint_event
from clients.endpoint_secrets import SecretBox
from clients.kafka_security import faust_credentials
from clients.outcome_keys import (
    require_outcome_keys,
    signer_for,
    signing_key_text,
    verifier_for,
    verify_key_texts,
)
from clients.outcome_signing import private_key, public_text
from clients.record_size import MAX_RECORD_BYTES
from config.settings import Settings
from events.base import Event
from events.codec import encode
from events.deadletter import DeadLetter
from events.endpoints import EndpointEvent
from events.errors import ConfigError
from events.private_files import private_dir
from events.refusal import one_line
from events.topics import record_key
from streams.agent_log import quiet
from streams.breaker_gate import BreakerGate
from streams.breaker_rule import BreakerRule
from streams.broker_clock import BrokerClock
from streams.budget_gate import BudgetGate, BudgetLog
from streams.channels.registry import ChannelRegistry
from streams.channels.webhook import WebhookChannel
from streams.claim_budget import ClaimBudget
from streams.context import worker_context
from streams.continuity import ContinuityGuard
from streams.endpoint_gate import EndpointGate
from streams.fan_out import RunFanOut
from streams.gates import Gate, Gates
from streams.heartbeat import Heartbeat
from streams.metrics import WorkerMetrics
from streams.outcome_producer import OutcomeProducer
from streams.own_records import OwnRecords
from streams.processor import DeliveryProcessor, Record
from streams.rate_gate import RATE_TICK_S, RateGate
from streams.rate_limits import FirstRateLimit, RegistryRateLimits, SettingsRateLimits
from streams.retry import RegistryRetryPolicies
from streams.send_pacer import PaceRule, SendPacer
from streams.sender import (
    MOVED_UNREAD,
    REVOKED,
    SHUTDOWN,
    SHUTDOWN_UNREAD,
    Refusal,
    Sender,
)
from streams.table_store import TableStore
from streams.timers import DueIndex
from streams.transport import LedgerApp
from streams.watchdog import ConsumerLag, Watchdog

log = logging.getLogger(__name__)

CONTINUITY_VERIFY_EVERY_S = 1.0

# Per partition database of the delivery table: small memtables and a small block cache.
# The working set is the open deliveries' recent states; RocksDB reads the rest from disk.
TABLE_ROCKSDB_OPTIONS = {
    "write_buffer_size": 4 * 1024 * 1024,
    "max_write_buffer_number": 2,
    "target_file_size_base": 16 * 1024 * 1024,
    "block_cache_size": 8 * 1024 * 1024,
    "block_cache_compressed_size": 0,
}


def new_worker_id(name: str) -> str:
    """Unique per process: a claim is acted on only by the process that made it."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def check_outcome_keys(settings: Settings) -> None:
    """A worker must sign its own events (signing is on by default), with a key the other
    readers accept, or every one of its claims would be refused."""
    require_outcome_keys(settings, signs=True)
    key = signing_key_text(settings)
    verify = verify_key_texts(settings)
    if key is None or not verify:
        return
    if public_text(private_key(key)) not in verify:
        raise ConfigError(
            "LEDGER_SIGNING__SIGNING_KEY is not the pair of any LEDGER_SIGNING__VERIFY_KEYS "
            "entry: the projector would refuse this worker's events",
            "add its public key to LEDGER_SIGNING__VERIFY_KEYS everywhere",
        )


class Worker:
    """One ``ledger worker`` process: the faust app and the handlers it calls."""

    def __init__(self, settings: Settings, name: str = "worker") -> None:
        check_outcome_keys(settings)
        self.settings = settings
        self.worker_id = new_worker_id(name)
        self.owned: set[int] = set()
        # Revoked and not yet known to come back: decided at the next assignment.
        self._revoked: set[int] = set()
        self.datadir = settings.data_dir / "worker" / settings.worker.group / name
        private_dir(settings.data_dir)
        private_dir(self.datadir)
        self.app: Any = _faust_app(settings, self.datadir, name)
        self.deliveries: Any = _raw_topic(
            self.app, settings.kafka.topic_deliveries, settings.kafka.partitions
        )
        self.deadletters: Any = _raw_topic(self.app, settings.kafka.topic_deadletter, None)
        self.runs: Any = _raw_topic(self.app, settings.kafka.topic_runs, settings.kafka.partitions)
        self.table: Any = self.app.Table(
            "delivery-state",
            default=None,
            partitions=settings.kafka.partitions,
            key_type=str,
            value_type=bytes,
            # faust's RocksDB defaults (64 MB x 3 memtables and a 2 GB block cache per
            # partition) let a worker with a million open deliveries grow past a gigabyte.
            options=TABLE_ROCKSDB_OPTIONS,
        )
        self.store = TableStore(self.table)
        self.app.write_back = self.store
        # One clock for every worker: the broker's, measured by a heartbeat.
        self.clock = BrokerClock(settings.worker.clock_skew_limit_s, settings.worker.clock_stale_s)
        self.heartbeat = Heartbeat(settings.kafka, settings.worker, self.worker_id, self.clock)
        self.signer = signer_for(settings)
        # The worker's own claims and outcomes, taken back by the processor without a second
        # decode and signature check (streams/own_records.py). Not when it signs nothing
        # but checks signatures: then its own outcomes are refused, as before.
        self.own = (
            OwnRecords() if self.signer is not None or verifier_for(settings) is None else None
        )
        self.outcomes = OutcomeProducer(settings, self.own)
        self.metrics = WorkerMetrics()
        self.registry = ChannelRegistry(settings, metrics=self.metrics)
        # The endpoint registry (ledger.endpoints), followed while the worker runs: its
        # webhook endpoints sign beside the settings' (and win for the same prefix), its
        # paused and disabled endpoints hold their deliveries (streams/endpoint_gate.py).
        self.endpoint_registry = EndpointRegistry(settings.kafka, SecretBox.of(settings.endpoints))
        webhook = self.registry.channels.get("webhook")
        if isinstance(webhook, WebhookChannel):
            webhook.follow(self.endpoint_registry)
        self.endpoint_gate = EndpointGate(self.endpoint_registry, settings.endpoints.recheck_s)
        # Each endpoint's circuit breaker: this worker's sends open and close it, through
        # the registry's log; its gate holds an open endpoint's deliveries.
        self.breaker = BreakerGate(
            self.endpoint_registry,
            self.endpoint_gate.endpoint_of,
            BreakerRule.of(settings.breaker),
            self.append_endpoint_event,
            worker_id=self.worker_id,
            producer=f"ledger-worker/{name}",
            recheck_s=settings.endpoints.recheck_s,
            enabled=settings.breaker.enabled,
            metrics=self.metrics,
        )
        ctx = worker_context(
            settings.worker,
            settings.channels,
            worker_id=self.worker_id,
            producer=f"ledger-worker/{name}",
            channels=self.registry.channels,
            # A registered endpoint's retry policy wins over the environment's, read from
            # the registry at each decision (a change applies without a restart).
            endpoint_policy=RegistryRetryPolicies(
                self.endpoint_registry, self.endpoint_gate.endpoint_of
            ),
        )
        self.budget = ClaimBudget(
            concurrency=settings.channels.send_concurrency,
            lease_s=settings.worker.lease_s,
            # The longest channel deadline: the budget stays safe for the slowest channel.
            deadline_s=settings.channels.longest_send_deadline_s,
            margin_s=settings.worker.clock_skew_margin_s,
            fixed=settings.worker.max_open_claims,
        )
        # The registry's limits first (they change at run time), then the settings'.
        self.rate_limits = FirstRateLimit(
            [
                RegistryRateLimits(self.endpoint_registry, self.endpoint_gate.endpoint_of),
                SettingsRateLimits(settings.channels),
            ]
        )
        # The rate limits at the send as well as at the claim: arrivals keep the limit.
        self.pacer = SendPacer(
            PaceRule(self.rate_limits, tick_s=RATE_TICK_S), self.clock.now, metrics=self.metrics
        )
        self.pacer.share(0, settings.kafka.partitions)
        self.sender = Sender(
            channels=self.registry.channels,
            ctx=ctx,
            append=self.outcomes.append,
            clock=self.clock.now,
            concurrency=settings.channels.send_concurrency,
            current=self.store.get,
            owns=self.owned.__contains__,
            deadline_s=settings.channels.send_deadline_s,
            skew_margin_s=settings.worker.clock_skew_margin_s,
            deadlines=settings.channels.send_deadlines,
            max_payload_bytes=settings.publisher.max_payload_bytes,
            faults=settings.faults,
            metrics=self.metrics,
            observe=self.budget.observe,
            halted=self.clock.why_not,
            judge=self.breaker.judge,
            pacer=self.pacer if settings.channels.rate_limit_pacing else None,
        )
        self.due = DueIndex(self.datadir / "due-index")
        # The timers run on the worker's tick and also as soon as a delivery held by a rate
        # limit has its token due (on_rate_tick): one at a time.
        self._ticking = asyncio.Lock()
        self.rate_gate = RateGate(self.rate_limits, tick_s=RATE_TICK_S, metrics=self.metrics)
        self.rate_gate.share(0, settings.kafka.partitions)
        # Agents' send budgets: the whole budgets topic, read in the background (started
        # at the first tick; until it has been read, deliveries wait).
        self.send_budgets = BudgetLog(settings, verifier=verifier_for(settings), signer=self.signer)
        self.budget_gate = BudgetGate(self.send_budgets, producer=f"ledger-worker/{name}")
        self.continuity = ContinuityGuard(
            settings, settings.kafka.topic_deliveries, settings.worker.group
        )
        self.processor = DeliveryProcessor(
            ctx=ctx,
            store=self.store,
            append_claims=self.append_claims,
            append_outcomes=self.outcomes.append,
            dead_letter=self.dead_letter,
            sender=self.sender,
            due=self.due,
            clock=self.clock.now,
            max_open_claims=self.budget.limit,
            continuous=self.continuity.continuous,
            faults=settings.faults,
            metrics=self.metrics,
            verifier=verifier_for(settings),
            own=self.own,
            # Neither while the clock is off the broker's nor once the worker is stopping.
            acting=lambda: not self.clock.skewed and not self.app.should_stop,
            gate=Gates(self._gates()),
        )
        self.fan_out = RunFanOut(
            send=self.append_request,
            flush=lambda: self.app.producer.flush(),
            dead_letter=self.dead_letter,
            worker_id=self.worker_id,
            faults=settings.faults,
        )
        self.lag = ConsumerLag(self.app, settings.kafka.topic_deliveries, self.continuity)
        self.watchdog = Watchdog(self.lag)
        self._next_verify = 0.0
        self._watch_metrics()
        self._connect()

    def _gates(self) -> list[Gate]:
        """What may hold a delivery before its claim (streams/gates.py), in the order asked:
        the holds an operator must see first, a rate limit (which spends a token) last."""
        # The endpoint's holds first; then the budget (before the breaker, so that an
        # over-budget delivery is never its half-open probe); a rate limit (which spends a
        # token) last.
        gates: list[Gate] = [self.endpoint_gate, self.budget_gate, self.breaker, self.rate_gate]
        return gates

    def _watch_metrics(self) -> None:
        watch = self.metrics.watch
        watch(
            "ledger_worker_due_timers",
            "Timers scheduled (leases, retries, lookups).",
            lambda: self.due.size,
        )
        watch(
            "ledger_worker_inflight_sends",
            "Sends and lookups in flight.",
            lambda: self.sender.in_flight,
        )
        watch(
            "ledger_worker_consumer_lag",
            "Records waiting in owned partitions.",
            lambda: self.lag.value,
        )
        watch(
            "ledger_worker_owned_partitions",
            "Partitions this worker owns.",
            lambda: len(self.owned),
        )
        watch(
            "ledger_worker_state_puts",
            "Delivery states put by the fold (counted).",
            lambda: self.store.puts,
        )
        watch(
            "ledger_worker_state_writes",
            "Delivery states written to the table and its changelog (counted): the puts "
            "less those overwritten before the next offset commit.",
            lambda: self.store.writes,
        )
        watch(
            "ledger_worker_clock_offset_seconds",
            "The broker's clock minus this worker's, as its heartbeats measure it.",
            lambda: self.clock.offset_s,
        )
        watch(
            "ledger_worker_clock_skew",
            "1 while this worker does not act: its clock is off the broker's by more than "
            "LEDGER_WORKER__CLOCK_SKEW_LIMIT_S, or not measured.",
            lambda: float(self.clock.skewed),
        )
        watch(
            "ledger_worker_budgets_read",
            "1 once this worker has read the agents' budgets to the end (until then its "
            "deliveries wait).",
            lambda: float(self.send_budgets.ready),
        )
        watch(
            "ledger_worker_budget_records_refused",
            "Records of the budgets topic skipped: undecodable, or not signed as they must "
            "be (counted; the live projector dead-letters them).",
            lambda: self.send_budgets.refused,
        )
        watch(
            "ledger_worker_endpoint_records_refused",
            "Records of the endpoint registry skipped as not endpoint events (counted; the "
            "live projector dead-letters them).",
            lambda: self.endpoint_registry.refused,
        )
        watch(
            "ledger_worker_rate_limited_waiting",
            "Deliveries waiting now for a token of their endpoint's rate limit.",
            lambda: self.rate_gate.waiting,
        )
        watch(
            "ledger_worker_rate_paced_waiting",
            "Claimed sends waiting now at the hand-off for their endpoint's pace.",
            lambda: self.pacer.waiting,
        )
        watch(
            "ledger_worker_sender_failures",
            "Sender tasks that raised (counted).",
            lambda: self.sender.failures,
        )
        self.metrics.watch_labeled(
            "ledger_worker_endpoint_circuit",
            "1 for each registered endpoint's circuit-breaker state (closed, open, "
            "half_open) as this worker reads the registry, 0 for the others.",
            ("endpoint", "state"),
            self.breaker.circuits,
        )

    def _connect(self) -> None:
        """Register the handlers with faust (its decorators, applied here)."""
        quiet(self.app.agent(self.deliveries, name="delivery-state-machine")(self.state_machine))
        quiet(self.app.agent(self.runs, name="run-fan-out")(self.run_fan_out))
        self.app.on_partitions_assigned.connect(self.on_assigned)
        self.app.on_partitions_revoked.connect(self.on_revoked)
        self.table.on_recover(self.on_recovered)
        self.app.timer(interval=self.settings.worker.timer_interval_s)(self.on_tick)
        # Always: a registered endpoint may be given a limit at any time. Idle, a look is
        # a comparison with the earliest recheck time given out.
        self.app.timer(interval=RATE_TICK_S)(self.on_rate_tick)
        self.app.on_before_shutdown.connect(self.on_shutdown)
        self.app.task(self.follow_endpoints)

    def replicate(self, factor: int, min_insync: int | None) -> None:
        """Topics this worker declares (its table's changelog) get ``factor`` copies and,
        when given, ``min.insync.replicas``: the cluster's replication (ledger/topics.py),
        known once a broker answered, so before the app starts rather than at creation."""
        self.app.conf.topic_replication_factor = factor
        if min_insync is not None:
            topic = self.table.changelog_topic
            topic.config = {**(topic.config or {}), "min.insync.replicas": str(min_insync)}

    async def append_endpoint_event(self, event: EndpointEvent) -> None:
        """A circuit-breaker transition, to ``ledger.endpoints`` (rare: a producer each)."""
        await append_endpoint_event(self.settings.kafka, event)

    async def follow_endpoints(self) -> None:
        """The registry's reader, for as long as the worker runs."""
        await self.endpoint_registry.follow()

    async def append_claims(self, events: Sequence[Event]) -> None:
        """Claims, through the agent's producer (at-least-once: the fold dedupes)."""
        for event in events:
            value = encode(event)
            headers = None if self.signer is None else self.signer.headers(value)
            if self.own is not None:
                self.own.remember(value, event, headers)
            await self.deliveries.send(key=record_key(event), value=value, headers=headers)  # type: ignore[arg-type]

    async def append_request(
        self, key: bytes, value: bytes, headers: list[tuple[str, bytes]] | None
    ) -> None:
        """A fanned-out request, through the agent's producer (at-least-once: the fold
        dedupes by event_id, which the fan-out derives from the run)."""
        await self.deliveries.send(key=key, value=value, headers=headers)

    async def dead_letter(self, record: Record, reason: str) -> None:
        """A record the processor cannot use, with the reason, to ``ledger.deadletter``."""
        letter = DeadLetter.of(
            reason=reason,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            detected_by=self.worker_id,
        )
        await self.deadletters.send(key=record.key, value=letter.model_dump_json().encode())

    async def state_machine(self, stream: Any) -> AsyncIterator[None]:
        """The agent: every record, in partition order, through the processor."""
        async for event in stream.events():
            record = _record_of(event.message)
            try:
                self.continuity.note(record.partition, record.offset)
                await self.processor.handle(record)
            except BaseException as exc:  # noqa: BLE001 - the process exits, below
                _exit_without_commit("delivery agent", record, exc)
            self.watchdog.progressed()
            yield None

    async def run_fan_out(self, stream: Any) -> AsyncIterator[None]:
        """The agent of ``ledger.runs``: each run record's deliveries, fanned out."""
        async for event in stream.events():
            record = _record_of(event.message)
            try:
                await self.fan_out.handle(record)
            except BaseException as exc:  # noqa: BLE001 - the process exits, below
                # The next owner fans the run out again.
                _exit_without_commit("fan-out agent", record, exc)
            yield None

    async def on_assigned(self, _app: Any, assigned: set[Any], **_: Any) -> None:
        """New assignment: forget what moved away, start checking continuity."""
        if self.app.should_stop:
            # A rebalance while stopping: nothing is taken on (reading the new partitions'
            # ends could hold the exit for the consumer's 40 s timeout); held sends and
            # unread claims are released by on_shutdown.
            log.info("stopping: assignment ignored")
            return
        mine = {tp.partition for tp in assigned if tp.topic == self.settings.kafka.topic_deliveries}
        # What moved away since the last assignment (an eager rebalance revokes everything
        # first): its held sends are taken back, its unread claims recorded not sent.
        gone = (self.owned | self._revoked) - mine
        self._revoked.clear()
        for partition in gone:
            self.processor.forget(partition)
        await self.sender.stop_partitions(gone, REVOKED)
        await self.release_unread(gone, MOVED_UNREAD)
        self.store.forget()  # the table is recovered for what this worker now owns
        self.owned.clear()
        self.owned.update(mine)
        # What stayed: its held sends go on, each through the write guard (lease, token).
        self.sender.resume()
        self.rate_gate.share(len(mine), self.settings.kafka.partitions)
        self.pacer.share(len(mine), self.settings.kafka.partitions)
        await self.continuity.on_assigned(mine)
        log.info("worker %s owns partitions %s", self.worker_id, sorted(mine))

    async def on_revoked(self, _app: Any, revoked: set[Any], **_: Any) -> None:
        """Revocation: no send of those partitions may go out while they are not ours.

        The sends not yet written wait (``Sender.hold``) rather than being taken back: an
        eager rebalance revokes every partition and gives most of them straight back, and
        taking back every queued send at each rebalance recorded thousands "not sent" (and
        claimed them again) while a group churned. The next assignment takes back those of
        the partitions that moved away; the write guard still checks ownership, the token
        and the lease right before each first byte."""
        gone = {tp.partition for tp in revoked if tp.topic == self.settings.kafka.topic_deliveries}
        self.sender.hold()
        self._revoked |= gone
        self.owned.difference_update(gone)
        self.rate_gate.share(len(self.owned), self.settings.kafka.partitions)
        self.pacer.share(len(self.owned), self.settings.kafka.partitions)
        for partition in gone:
            self.processor.forget(partition)
        # faust flushed its producer before this signal: what the table still holds goes
        # to the changelog now, before the partitions' next owner recovers them.
        written = self.store.flush()
        self.store.forget()
        if written:
            await self.app.producer.flush()

    async def on_recovered(self) -> None:
        """Tables recovered: timers are derived state, rebuilt from the table."""
        self.store.forget()  # recovery wrote the table behind the cache
        total = sum(self.processor.reindex(p, self.store.partition_states(p)) for p in self.owned)
        log.info("rebuilt %d timers for partitions %s", total, sorted(self.owned))
        self.watchdog.ready()

    async def on_tick(self) -> None:
        """The heartbeat, due timers, lag, the watchdog and the continuity check."""
        self.heartbeat.maybe_beat()
        self.send_budgets.start()
        # Continuity first: timers act only on partitions whose state follows the log.
        await self.check_continuity()
        if self.owned and not self.app.in_recovery:
            async with self._ticking:
                began = time.perf_counter()
                await self.processor.tick(set(self.owned))
                self.metrics.timer_tick_seconds.observe(time.perf_counter() - began)
        self.lag.refresh()
        self.watchdog.check(self.app.in_recovery)

    async def on_rate_tick(self) -> None:
        """The timers, now, if a delivery held by a rate limit has its token due: a held
        delivery waits for its token, not for the next tick (streams/rate_gate.py)."""
        if not self.owned or self.app.in_recovery or self._ticking.locked():
            return
        if self.rate_gate.recheck_due(self.clock.now()):
            async with self._ticking:
                await self.processor.tick(set(self.owned))

    async def check_continuity(self) -> None:
        """Verify noted jumps and stalled tails, rewind the stream to skipped records, save
        what is verified."""
        periodic = time.monotonic() >= self._next_verify
        if periodic and not self.app.in_recovery:
            self._next_verify = time.monotonic() + CONTINUITY_VERIFY_EVERY_S
            try:
                await self.continuity.check_tails(set(self.owned))
            except TRANSIENT as exc:  # checked again next time; never stops the worker
                log.warning("could not check the partitions' ends: %s", exc)
        if self.app.in_recovery:
            return  # recovery ends with its own seek; rewinds before it would be undone
        if self.continuity.pending:  # every tick: the partition's timers wait for it
            found = await self.continuity.verify()
            if found:
                self.metrics.skipped_recovered.inc(found)
        for partition, offset in self.continuity.take_rewinds().items():
            if partition not in self.owned:
                continue
            try:
                await self.app.consumer.seek(
                    TP(self.settings.kafka.topic_deliveries, partition), offset
                )
            except KafkaError as exc:  # mid-rebalance; the record is asked for again later
                log.warning("could not rewind partition %d to %d: %s", partition, offset, exc)
        if not periodic:
            return
        try:
            await self.continuity.save_marks(set(self.owned))
        except TRANSIENT as exc:  # saved again next time; never stops the worker
            log.warning("could not save continuity marks: %s", exc)

    async def release_unread(self, partitions: set[int] | None, why: Refusal) -> int:
        """Record not sent the claims this worker appended in ``partitions`` (None: all) and
        will not read back. Their appends are flushed first (acknowledged), so each "not
        sent" lands after its claim: the fold ignores one that comes first."""
        claims = self.processor.unread_claims(partitions)
        if not claims:
            return 0
        await self.app.producer.flush()
        return await self.sender.release(claims, why)

    async def on_shutdown(self, _app: Any, **_: Any) -> None:
        """A graceful stop (SIGTERM, a rolling restart) leaves no UNKNOWN behind: no new
        claim (``acting`` is false once faust stops), queued sends taken back and claims
        not read back recorded not sent; written sends finish, bounded by the deadline.
        faust then commits and leaves the group."""
        self.processor.stop_claiming()
        async with self._ticking:  # a tick under way finishes its appends first
            self.owned.clear()
        await self.sender.stop_partitions(self.sender.partitions_in_use, SHUTDOWN)
        await self.release_unread(None, SHUTDOWN_UNREAD)
        await self.sender.drain(timeout_s=self.settings.channels.longest_send_deadline_s + 1)
        await self.outcomes.stop()
        await self.send_budgets.stop()
        await self.heartbeat.stop()
        await self.registry.aclose()
        await self.breaker.stop()
        await self.endpoint_registry.stop()
        await self.continuity.stop()


def create_app(settings: Settings, name: str = "worker") -> Worker:
    """Build one worker: its faust app and handlers; nothing global, nothing started."""
    return Worker(settings, name)


def _faust_app(settings: Settings, datadir: Any, name: str) -> Any:
    # faust's decorators and signals are loosely typed; the app is handled as Any here.
    app = LedgerApp(
        settings.worker.group,
        broker=f"kafka://{settings.kafka.bootstrap_servers}",
        broker_credentials=faust_credentials(settings.kafka),
        # at-least-once, deliberately: faust's exactly_once crash-loops on every rebalance of
        # a multi-worker group against Kafka 4.1 (ConsistencyError on an unfetched LSO, then
        # ProducerFenced from reused producers), and after a SIGKILL it still replayed
        # duplicates and skipped offsets. Correctness comes from the fold instead: dedupe
        # by event_id, fencing tokens, one send per (key, token) per process, leases.
        processing_guarantee="at_least_once",
        store="rocksdb://",
        datadir=str(datadir),
        topic_partitions=settings.kafka.partitions,
        topic_allow_declare=True,
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_commit_interval=0.5,
        web_enabled=False,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        # A dying agent must take the worker down, not leave it alive consuming nothing.
        agent_supervisor=CrashingSupervisor,
        autodiscover=False,
        # Keys and values are bytes we encode ourselves (events/codec.py, state_codec.py).
        key_serializer="raw",
        value_serializer="raw",
        stream_wait_empty=False,
        # Claims, dead letters and changelog writes are small: let them share requests.
        producer_linger=settings.worker.linger_s,
        # Fanned-out requests may be as large as any record the publisher writes.
        producer_max_request_size=MAX_RECORD_BYTES,
        table_standby_replicas=settings.worker.standby_replicas,
        # A worker restarted under its name (SIGKILL and a supervisor, a rolling restart)
        # rejoins as the same static member and gets its partitions back without a
        # rebalance: the other workers keep sending (issue 31, blast radius).
        consumer_group_instance_id=(
            f"{name}@{socket.gethostname()}" if settings.worker.static_membership else None
        ),
    )
    app.fetch_wait_ms = settings.worker.fetch_wait_s * 1000
    return app


def _raw_topic(app: Any, name: str, partitions: int | None) -> Any:
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        **({"partitions": partitions} if partitions is not None else {}),
    )


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    """faust's message headers (a list of pairs, or a mapping) as a tuple of pairs."""
    if not raw:
        return ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((str(name), bytes(value or b"")) for name, value in pairs)


def _record_of(message: Any) -> Record:
    """A faust message as the processors' ``Record``."""
    return Record(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        value=message.value,
        headers=_headers(message.headers),
    )


def _exit_without_commit(agent: str, record: Record, exc: BaseException) -> NoReturn:
    """An agent failed, not because of ``record`` (the processors dead-letter what is): the
    table, the producer or the disk failed. Crash loudly and WITHOUT committing the record:
    faust's supervisors would commit it first (it would be lost) or restart the agent
    quietly. The record's coordinates, never its bytes."""
    log.critical(
        "%s failed on %s[%d]@%d, not because of the record (%s); exiting",
        agent,
        record.topic,
        record.partition,
        record.offset,
        one_line(exc),
        exc_info=True,
    )
    logging.shutdown()
    os._exit(70)
