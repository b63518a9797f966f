"""The publisher SDK agents use: a run's result and its deliveries, atomically.

    async with Publisher(settings) as publisher:
        await publisher.run_succeeded(
            "run-42", "sha256:...",
            deliveries=[DeliverySpec(channel="webhook", recipient="https://example.test/hook",
                                     payload={"text": "done"})],
        )

Two modes (``LEDGER_PUBLISHER__MODE``, or ``mode=``), each all or nothing:

- ``transaction``: ``RunSucceeded`` and one ``DeliveryRequested`` per delivery in ONE Kafka
  transaction; concurrent callers share transactions (group commit). A crash before the
  commit leaves nothing visible to ``read_committed`` consumers (failure matrix, row 1).
- ``record``: ONE ``RunSucceeded`` record carrying the deliveries, sent by an idempotent
  producer (``acks=all``) without a transaction; a worker fans it out to the deliveries
  topic (events/fan_out.py). One record is written whole or not at all, and no reader ever
  waits behind an open transaction. The record's 1 MB bounds a run's deliveries.
"""

from __future__ import annotations

import json
import uuid
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlsplit

from aiokafka import AIOKafkaProducer
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from clients.group_commit import GroupCommit, Journal, Record
from clients.group_commit import PublishFailed as PublishFailed  # part of the SDK
from clients.kafka_security import client_options, start_producer
from clients.record_size import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # part of the SDK
from clients.record_size import record_size
from clients.tracing import TRACEPARENT, current_traceparent, span
from config.settings import Settings, address_policy
from events.admission import payload_too_large
from events.base import Event, check_run_id
from events.bounds import MAX_RUN_DELIVERIES, MAX_SLO_SECONDS
from events.channels import (
    channel_names,
    check_channel,
    check_recipient,
    recipient_refusal,
    shown,
)
from events.codec import MAX_DEPTH, encode, json_depth
from events.delivery import DeliveryRequested, new_delivery_requested
from events.execution import RunFailed, RunMarkedUnknown, RunStarted, RunSucceeded
from events.fan_out import ENTRY_DEPTH, EntryRefused, delivery_entry, fan_out
from events.faults import PUBLISHER_BEFORE_COMMIT, crash_if_enabled
from events.payload_hashes import jcs_refusal
from events.topics import record_key

PublishMode = Literal["transaction", "record"]


class PublishRejected(ValueError):
    """Input refused before anything was written; the message names what was wrong."""


def _installed_channels(schema: dict[str, JsonValue]) -> None:
    """The installed channels, listed in the schema (OpenAPI, JSON Schema) when it is made."""
    names: list[JsonValue] = list(channel_names())
    schema["enum"] = names


class DeliverySpec(BaseModel):
    """One delivery an agent asks for: a channel, a recipient and a JSON payload."""

    # Inputs stay out of error texts: a recipient may carry a secret, a payload anything.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    channel: str = Field(json_schema_extra=_installed_channels)
    recipient: str
    payload: JsonValue = Field(default_factory=dict)
    event_type: str = Field(default="run.succeeded", pattern=r"^[A-Za-z0-9._\-]{1,100}$")
    slo_seconds: int | None = Field(default=None, ge=1, le=MAX_SLO_SECONDS)

    @field_validator("channel")
    @classmethod
    def _channel(cls, value: str) -> str:
        return check_channel(value)

    @field_validator("recipient")
    @classmethod
    def _recipient(cls, value: str, info: Any) -> str:
        channel = info.data.get("channel")
        if channel is None:
            return value
        # The form first (what the reader of the log will check), then the policy.
        check_recipient(channel, value)
        if (why := recipient_refusal(channel, value)) is not None:
            raise ValueError(why)
        return value

    @classmethod
    def parse(cls, spec: str, payload: JsonValue) -> DeliverySpec:
        """Parse ``CHANNEL:RECIPIENT`` as the CLI takes it."""
        channel, sep, recipient = spec.partition(":")
        if channel.lower() in ("http", "https") and recipient.startswith("//"):
            # The spec is not repeated: a recipient may carry a secret.
            known = ", ".join(channel_names())
            raise PublishRejected(
                f"a delivery needs a channel prefix, like webhook:{channel}://... "
                f"(channels: {known})"
            )
        if not sep or not channel or not recipient:
            raise PublishRejected(f"delivery {spec!r} is not CHANNEL:RECIPIENT")
        return build_spec(channel=channel, recipient=recipient, payload=payload)


def build_spec(**fields: Any) -> DeliverySpec:
    """A ``DeliverySpec`` or a ``PublishRejected`` naming the bad field."""
    try:
        return DeliverySpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "delivery"
        raise PublishRejected(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


def parse_payload(text: str) -> JsonValue:
    """A payload given on the command line: JSON text, or ``@path`` to a JSON file."""
    source = "payload"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise PublishRejected(f"cannot read payload file {source}: {exc.strerror}") from None
    try:
        value: JsonValue = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PublishRejected(f"{source} is not JSON: {exc}") from None
    except RecursionError:
        raise PublishRejected(f"{source} nests too deeply to be a payload") from None
    return value


class Publisher:
    """Async context manager over an aiokafka producer: transactional (``transaction``
    mode) or idempotent (``record`` mode).

    In the transaction mode concurrent calls share Kafka transactions (group commit,
    clients/group_commit.py): each returns once the transaction carrying its run committed,
    or raises ``PublishFailed`` if that transaction failed. In the record mode each run is
    one record, acknowledged by every in-sync replica before the call returns. Either way
    a ``PublishRejected`` run is refused alone, unwritten.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        producer_name: str | None = None,
        transactional_id: str | None = None,
        journal: Journal | None = None,
        mode: PublishMode | None = None,
    ) -> None:
        """``transactional_id`` (transaction mode; unused in the record mode) should be
        stable per agent instance: a restart then fences its dead predecessor and aborts
        that one's open transaction immediately. ``journal``: records kept beside the runs
        that come with a ``ticket``, one write per transaction (clients/group_commit.py;
        the HTTP API's first answers; transaction mode only). ``mode``: the settings' by
        default (``LEDGER_PUBLISHER__MODE``)."""
        self._settings = settings
        self.mode: PublishMode = mode or settings.publisher.mode
        if journal is not None and self.mode != "transaction":
            raise ValueError("a journal needs the transaction mode (one write per transaction)")
        self._journal = journal
        self._addresses = address_policy(settings.channels)
        self._producer_name = producer_name or settings.publisher.producer_name
        self._transactional_id = transactional_id or (
            f"ledger-publisher-{self._producer_name}-{uuid.uuid4().hex[:12]}"
        )
        self._producer: AIOKafkaProducer | None = None
        self._group: GroupCommit | None = None
        self._records = 0

    async def start(self) -> None:
        """Connect (and, in the transaction mode, initialise the transactional producer)."""
        if self.mode == "record":
            # No transaction: idempotence keeps a retried send from writing the record twice.
            producer = AIOKafkaProducer(
                bootstrap_servers=self._settings.kafka.bootstrap_servers,
                enable_idempotence=True,
                acks="all",
                linger_ms=0,
                max_request_size=MAX_RECORD_BYTES,
                **client_options(self._settings.kafka),
            )
            await start_producer(producer, self._settings.kafka)
            self._producer = producer
            return
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.kafka.bootstrap_servers,
            transactional_id=self._transactional_id,
            enable_idempotence=True,
            acks="all",
            # A publisher that dies mid-transaction holds back read_committed consumers of
            # the partitions it touched until the broker aborts it: keep that window short.
            # Restarting with the same transactional_id aborts it at once.
            transaction_timeout_ms=round(self._settings.publisher.transaction_timeout_s * 1000),
            linger_ms=0,
            max_request_size=MAX_RECORD_BYTES,
            **client_options(self._settings.kafka),
        )
        await start_producer(producer, self._settings.kafka)
        self._producer = producer
        self._group = GroupCommit(producer, self._settings, self._transactional_id, self._journal)
        self._group.start()

    async def stop(self) -> None:
        """Commit what callers have queued, then disconnect; a caller whose run could not
        be committed gets ``PublishFailed``."""
        if self._group is not None:
            await self._group.close()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    @property
    def journal(self) -> Journal | None:
        """The records kept beside ticketed runs (``journal=``), if any."""
        return self._journal

    @property
    def transactions_committed(self) -> int:
        """Kafka transactions this publisher committed (fewer than runs under concurrency)."""
        return self._group.transactions if self._group is not None else 0

    @property
    def runs_committed(self) -> int:
        """Runs (and lifecycle events) this publisher committed."""
        return self._group.runs if self._group is not None else self._records

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def run_started(
        self,
        run_id: str,
        *,
        agent: str | None = None,
        producer: str | None = None,
        ticket: object = None,
    ) -> RunStarted:
        """Record that a run began. ``producer``, on any call, names the agent the events
        come from, for a publisher shared by several (the HTTP API); by default the
        publisher's own name. ``ticket``, on any call: the journal's record of the run."""
        event = RunStarted(
            run_id=_run_id(run_id), agent=agent, producer=producer or self._producer_name
        )
        await self._commit([(self._settings.kafka.topic_runs, event)], ticket)
        return event

    async def run_failed(
        self, run_id: str, error: str, *, producer: str | None = None, ticket: object = None
    ) -> RunFailed:
        """Record that a run failed; no deliveries follow a failure."""
        if not error:
            raise PublishRejected("error must not be empty")
        event = RunFailed(
            run_id=_run_id(run_id), error=error, producer=producer or self._producer_name
        )
        await self._commit([(self._settings.kafka.topic_runs, event)], ticket)
        return event

    async def run_marked_unknown(
        self, run_id: str, reason: str, *, producer: str | None = None, ticket: object = None
    ) -> RunMarkedUnknown:
        """Record that nobody can tell whether the run finished (e.g. its agent vanished)."""
        if not reason:
            raise PublishRejected("reason must not be empty")
        event = RunMarkedUnknown(
            run_id=_run_id(run_id), reason=reason, producer=producer or self._producer_name
        )
        await self._commit([(self._settings.kafka.topic_runs, event)], ticket)
        return event

    async def run_succeeded(
        self,
        run_id: str,
        result_hash: str,
        deliveries: list[DeliverySpec] | tuple[DeliverySpec, ...] = (),
        *,
        producer: str | None = None,
    ) -> list[DeliveryRequested]:
        """Write ``RunSucceeded`` and one ``DeliveryRequested`` per delivery, atomically;
        the requests as the deliveries topic holds them (in the record mode, as the
        workers will fan them out).

        A span ``ledger.publish`` (a child of the caller's current span, if any) covers it;
        its context travels with each ``DeliveryRequested`` as a ``traceparent`` record
        header, so the worker's spans for the delivery continue the caller's trace.
        """
        requests = self.check_run_succeeded(run_id, result_hash, deliveries, producer=producer)
        return await self.publish_checked(run_id, result_hash, requests, producer=producer)

    async def publish_checked(
        self,
        run_id: str,
        result_hash: str,
        requests: list[DeliveryRequested],
        *,
        producer: str | None = None,
        ticket: object = None,
    ) -> list[DeliveryRequested]:
        """``run_succeeded`` for the requests ``check_run_succeeded`` returned (with the
        same ``run_id``, ``result_hash`` and ``producer``): checked and built once. Returns
        the requests written: ``requests`` in the transaction mode; in the record mode the
        same deliveries with the ids and times the fan-out derives from the run."""
        attributes = {
            "ledger.run_id": run_id,
            "ledger.deliveries": len(requests),
            "ledger.idempotency_keys": [request.idempotency_key for request in requests],
        }
        with span("ledger.publish", attributes, kind=SpanKind.PRODUCER):
            traceparent = current_traceparent()
            headers = None if traceparent is None else [(TRACEPARENT, traceparent.encode())]
            if self.mode == "record":
                return await self._publish_record(
                    run_id, result_hash, requests, producer=producer, headers=headers
                )
            run_event = RunSucceeded(
                run_id=run_id, result_hash=result_hash, producer=producer or self._producer_name
            )
            batch: list[tuple[str, Event]] = [(self._settings.kafka.topic_runs, run_event)]
            batch += [(self._settings.kafka.topic_deliveries, request) for request in requests]
            await self._commit(batch, ticket, headers)
        return requests

    async def _publish_record(
        self,
        run_id: str,
        result_hash: str,
        requests: list[DeliveryRequested],
        *,
        producer: str | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> list[DeliveryRequested]:
        """The record mode: one ``RunSucceeded`` carrying the deliveries."""
        if len(requests) > MAX_RUN_DELIVERIES:
            raise PublishRejected(
                f"run {run_id} has {len(requests)} deliveries; one run record carries at most "
                f"{MAX_RUN_DELIVERIES} (split the run, or LEDGER_PUBLISHER__MODE=transaction)"
            )
        run_event = RunSucceeded(
            run_id=run_id,
            result_hash=result_hash,
            producer=producer or self._producer_name,
            deliveries=tuple(delivery_entry(request) for request in requests),
        )
        fanned: list[DeliveryRequested] = []
        for index, request in enumerate(fan_out(run_event), start=1):
            if isinstance(request, EntryRefused):  # the SDK checked it: a bug if reached
                raise PublishRejected(f"delivery {index}: {request.reason}")
            # What the worker will write must fit a record too.
            size = record_size(record_key(request), encode(request), headers)
            if size > MAX_RECORD_BYTES:
                raise PublishRejected(
                    f"delivery {index} would be a {size}-byte Kafka record, over the limit "
                    f"of {MAX_RECORD_BYTES} (lower the payload)"
                )
            fanned.append(request)
        value, key = encode(run_event), record_key(run_event)
        size = record_size(key, value, headers)
        if size > MAX_RECORD_BYTES:
            raise PublishRejected(
                f"run {run_id} with {len(requests)} deliveries would be a {size}-byte Kafka "
                f"record, over the limit of {MAX_RECORD_BYTES} bytes one record may take "
                "(fewer or smaller deliveries per run, or LEDGER_PUBLISHER__MODE=transaction)"
            )
        await self._send(run_id, (self._settings.kafka.topic_runs, value, key, headers))
        return fanned

    def _blocked(self, recipient: str) -> str | None:
        """Why the worker would refuse to contact ``recipient``, when that is known
        without DNS (an address literal, ``localhost``); the worker checks every name."""
        parts = urlsplit(recipient)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None  # not a valid URL: check_recipient says so
        why = self._addresses.refuses_literal(parts.hostname or "", port)
        if why is None:
            return None
        return (
            f"recipient {shown(recipient)} is refused: {why} "
            "(allow it with LEDGER_CHANNELS__ALLOWED_NETWORKS or LEDGER_CHANNELS__ALLOWED_HOSTS)"
        )

    def check_run_succeeded(
        self,
        run_id: str,
        result_hash: str,
        deliveries: list[DeliverySpec] | tuple[DeliverySpec, ...] = (),
        *,
        producer: str | None = None,
    ) -> list[DeliveryRequested]:
        """Every check ``run_succeeded`` makes, without connecting: its requests, or
        ``PublishRejected``."""
        run_id = _run_id(run_id)
        if not result_hash or len(result_hash) > 200:
            raise PublishRejected("result_hash must be 1-200 characters")
        return self.delivery_requests(run_id, deliveries, producer=producer)

    def delivery_requests(
        self,
        run_id: str,
        deliveries: list[DeliverySpec] | tuple[DeliverySpec, ...],
        *,
        producer: str | None = None,
    ) -> list[DeliveryRequested]:
        """Validate every delivery and build its event; raise before anything is written."""
        requests: list[DeliveryRequested] = []
        seen: dict[str, int] = {}
        for index, spec in enumerate(deliveries, start=1):
            # Before the size (its JSON has no NaN either): a payload must have an RFC 8785
            # form for its hash (events/payload_hashes.py), which names the field.
            if unhashable := jcs_refusal(spec.payload):
                raise PublishRejected(f"delivery {index}: {unhashable}")
            # The event nests the payload one level down (a run record, ENTRY_DEPTH more);
            # deeper than the reader's limit, the record would only be dead-lettered.
            if (depth := json_depth(spec.payload)) > (deepest := self._deepest_payload()):
                raise PublishRejected(
                    f"delivery {index}: payload nests {depth} levels deep, over the limit of "
                    f"{deepest}"
                )
            if too_large := payload_too_large(
                spec.payload, self._settings.publisher.max_payload_bytes
            ):
                raise PublishRejected(f"delivery {index}: {too_large}")
            if blocked := self._blocked(spec.recipient):
                raise PublishRejected(f"delivery {index}: {blocked}")
            request = new_delivery_requested(
                run_id=run_id,
                event_type=spec.event_type,
                channel=spec.channel,
                recipient=spec.recipient,
                payload=spec.payload,
                slo_seconds=spec.slo_seconds or self._settings.publisher.default_slo_s,
                producer=producer or self._producer_name,
            )
            if request.idempotency_key in seen:
                raise PublishRejected(
                    f"delivery {index} repeats delivery {seen[request.idempotency_key]} "
                    "(same event type, channel and recipient: one logical event)"
                )
            seen[request.idempotency_key] = index
            requests.append(request)
        return requests

    def _deepest_payload(self) -> int:
        """How deeply a payload may nest in the record this publisher writes."""
        return MAX_DEPTH - 1 - (ENTRY_DEPTH if self.mode == "record" else 0)

    async def _commit(
        self,
        batch: list[tuple[str, Event]],
        ticket: object = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Encode one run's events, refuse any the producer would, and wait for the
        transaction that carries them all (in the record mode, for the one record);
        ``headers`` go on its delivery requests."""
        records: list[Record] = []
        for topic, event in batch:
            value, key = encode(event), record_key(event)  # type: ignore[arg-type]
            on = headers if isinstance(event, DeliveryRequested) else None
            size = record_size(key, value, on)
            if size > MAX_RECORD_BYTES:
                raise PublishRejected(
                    f"{type(event).__name__} would be a {size}-byte Kafka record, over the "
                    f"limit of {MAX_RECORD_BYTES} (lower the payload)"
                )
            records.append((topic, value, key, on))
        run_id: str = batch[0][1].run_id  # type: ignore[attr-defined]
        if self.mode == "record":
            [record] = records  # lifecycle events: one record each
            await self._send(run_id, record)
            return
        await self._require_started().submit(run_id, records, ticket)

    async def _send(self, run_id: str, record: Record) -> None:
        """The record mode: one record, acknowledged by all in-sync replicas."""
        producer = self._producer
        if producer is None:
            raise RuntimeError("Publisher is not started: use 'async with Publisher(...)'")
        topic, value, key, headers = record
        # The record mode's "before the commit" (failure matrix, row 1): nothing sent yet.
        crash_if_enabled(PUBLISHER_BEFORE_COMMIT, self._settings.faults)
        try:
            await producer.send_and_wait(topic, value, key=key, headers=headers)
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise PublishFailed(
                f"run {run_id} may not be published: its record was not acknowledged "
                f"({cause}); whether it was written is not known",
                "check whether the run is in the ledger before publishing it again "
                "(publishing it again is safe: the same run's deliveries are deduplicated)",
                written=None,
            ) from exc
        self._records += 1

    def _require_started(self) -> GroupCommit:
        if self._group is None or self._producer is None:
            raise RuntimeError("Publisher is not started: use 'async with Publisher(...)'")
        return self._group


def _run_id(run_id: str) -> str:
    try:
        return check_run_id(run_id)
    except ValueError as exc:
        raise PublishRejected(str(exc)) from None
