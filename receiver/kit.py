"""The receiver's side of the protocol, framework-neutral: verify, dedupe, fence, look up.

``WebhookReceiver.receive`` takes the request's headers and raw body and returns a
``Reply`` (status, JSON body, headers) that an adapter (``receiver.asgi``,
``receiver.aiohttp_adapter``) writes out. The key is recorded before the handler runs,
so a lookup never says "not found" about a request that is being processed.

The run holds a *handler lease* on the key (``handler_lease_s``, renewed every third of it
while the handler runs). A key left ``processing`` by a run that died (SIGKILL, a lost host)
stops being renewed; once its lease has run out the key is reclaimed, by the rule the user
declared:

- ``idempotent_handler=True``: running the handler twice for one key is harmless, so the
  key is offered again: lookups answer ``failed`` (a retry is safe) and the next request
  for it runs the handler again, under a new lease, fenced like any other.
- ``idempotent_handler=False`` (the default): a second run could do twice what the first
  may have done, so the handler never runs again for that key. Lookups answer ``stuck``
  (409) and a request for it is answered 409 ``stuck`` without running anything; the
  ledger shows the delivery UNKNOWN (``receiver_stuck``) for an operator to settle with
  ``ledger resolve``.

A handler that blocks the event loop (a synchronous one) cannot renew its lease while it
runs: size ``handler_lease_s`` above its longest run.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from events.contract import (
    FENCING_TOKEN_HEADER,
    LOOKUP_HTTP_STATUS,
    LookupStatus,
    lookup_answer,
    parse_fencing_token,
)
from receiver.records import Admission, KeyStatus, LeaseTerms, lease_expired
from receiver.store import IdempotencyStore, StoreUnavailable
from receiver.verification import SignatureVerifier

log = logging.getLogger("receiver")
MAX_POLLS = 1000  # with the deadline: a bound on the wait for a concurrent first request
# The largest body the adapters read (aiohttp's own default): a bigger one is refused 413
# while it arrives, before its signature could be checked.
MAX_BODY_BYTES = 1024 * 1024
# What a client is told to wait before trying again while the store is unreachable.
RETRY_AFTER_S = 5
# How long a connection may take to send a request head (and stay idle between requests)
# on the kit's servers (``receiver.aiohttp_adapter``, ``receiver.uvicorn_server``).
HEADER_TIMEOUT_S = 10.0
# How long a run's hold on its key lasts unless renewed; a dead run's key is reclaimed
# this long after its last renewal.
HANDLER_LEASE_S = 30.0
# Traces: the kit uses OpenTelemetry's API only; the receiver's application configures an
# SDK if it wants them exported (README, Tracing). The ledger's worker sends the W3C
# ``traceparent`` of its send (outside every signature): the kit's spans are its children.
TRACER = "delivery-ledger.receiver"
_W3C = TraceContextTextMapPropagator()
# The API's proxy: it follows the application's provider, set before or after this import.
_TRACER = trace.get_tracer(TRACER)


@dataclass(frozen=True)
class ReceivedWebhook:
    """One verified request, as the user's handler sees it."""

    webhook_id: str  # the idempotency key
    timestamp: int
    payload: Any  # the JSON body, parsed
    body: bytes
    fencing_token: int | None
    route: str = ""  # the path below the prefix (``/hooks/{route}``), "" for the prefix


Handler = Callable[[ReceivedWebhook], Awaitable[str] | str]


@dataclass(frozen=True)
class Reply:
    """What to answer: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def json_bytes(self) -> bytes:
        """The body as JSON bytes."""
        return json.dumps(self.body, separators=(",", ":")).encode()


class WebhookReceiver:
    """Runs ``handler`` once per idempotency key, however many times the key arrives.

    ``handler`` returns the id of what it made (an order id, a ticket id): it is the
    ``id`` of every later answer for that key and of the lookup. ``handler_lease_s`` is how
    long a run that stops renewing its lease (it died) keeps its key; then the key is run
    again if ``idempotent_handler`` is declared, else it is ``stuck`` for an operator (the
    module's docstring says why).
    """

    def __init__(
        self,
        handler: Handler,
        *,
        secrets: list[str] | tuple[str, ...],
        store: IdempotencyStore,
        tolerance_s: float = 300.0,
        in_progress_wait_s: float = 2.0,
        handler_lease_s: float = HANDLER_LEASE_S,
        idempotent_handler: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not handler_lease_s > 0:
            raise ValueError("handler_lease_s must be a positive number of seconds")
        self._handler = handler
        self._lease_s = handler_lease_s
        self.idempotent_handler = idempotent_handler
        self._instance = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # whose runs, in the store
        self.verifier = SignatureVerifier(secrets, tolerance_s=tolerance_s)
        self.store = store
        self._wait_s = in_progress_wait_s
        self._clock = clock
        self._settled: dict[str, asyncio.Event] = {}  # keys this process is running

    async def start(self) -> None:
        """Start the store."""
        await self.store.start()

    async def close(self) -> None:
        """Close the store."""
        await self.store.close()

    async def receive(self, headers: Mapping[str, str], body: bytes, route: str = "") -> Reply:
        """Handle one POST: 401 bad signature (body or token), 400 bad body or token,
        409 stale token, else the answer. A span ``ledger.receiver.receive`` covers it (and
        ``ledger.receiver.handler`` the handler's run), children of the sender's
        ``traceparent`` (or of the application's own server span, if it has one)."""
        with _TRACER.start_as_current_span(
            "ledger.receiver.receive", context=_parent(headers), kind=trace.SpanKind.SERVER
        ) as span:
            reply = await self._receive(headers, body, route)
            if span.is_recording():
                span.set_attribute("http.response.status_code", reply.status)
                if (key := headers.get("webhook-id")) is not None:
                    span.set_attribute("ledger.idempotency_key", key[:200])
                if (token := headers.get(FENCING_TOKEN_HEADER)) is not None:
                    span.set_attribute("ledger.fencing_token", token[:30])
                if "duplicate" in reply.body:
                    span.set_attribute("ledger.receiver.duplicate", bool(reply.body["duplicate"]))
            return reply

    async def _receive(self, headers: Mapping[str, str], body: bytes, route: str) -> Reply:
        problem = self.verifier.problem(headers, body, now=self._clock())
        if problem is not None:
            return Reply(401, {"error": "invalid webhook signature", "detail": problem})
        key = headers["webhook-id"]
        try:
            payload = json.loads(body)
        except ValueError:
            return Reply(400, {"error": "the body is not JSON", "webhook_id": key})
        raw_token = headers.get(FENCING_TOKEN_HEADER)
        token: int | None = None
        if raw_token is not None:
            try:
                token = parse_fencing_token(raw_token)
            except ValueError as exc:
                return Reply(400, {"error": str(exc), "webhook_id": key})
            # Unsigned, a token is anyone's to raise: a replay with 2^63-1 would fence out
            # every genuine retry of the key.
            if not self.verifier.token_verified(headers, token):
                return Reply(
                    401,
                    {
                        "error": "invalid fencing token signature",
                        "detail": "fencing-token-signature is missing or does not sign this "
                        "token for this webhook-id and timestamp with any of our secrets",
                        "webhook_id": key,
                    },
                )
        terms = LeaseTerms(
            f"{self._instance}-{uuid.uuid4().hex[:12]}",
            self._clock(),
            self._lease_s,
            self.idempotent_handler,
        )
        try:
            decision = await self.store.admit(key, token, terms)
        except StoreUnavailable as exc:
            return _unavailable(key, exc)
        if decision.admission is Admission.STALE:
            return Reply(
                409,
                {
                    "error": "stale fencing token",
                    "detail": f"fencing token {token} is older than {decision.seen_token}, "
                    f"already seen for webhook-id {key}; this attempt was superseded",
                    "webhook_id": key,
                },
            )
        if decision.admission is Admission.DUPLICATE:
            return _done(key, decision.record.result_id, duplicate=True)
        if decision.admission is Admission.STUCK:
            return _stuck(key)
        if decision.admission is Admission.IN_PROGRESS:
            try:
                return await self._await_first(key)
            except StoreUnavailable as exc:
                return _unavailable(key, exc)
        if decision.reclaimed:
            log.warning(
                "webhook-id %s: the run holding it stopped renewing its lease (it died); "
                "running the idempotent handler again",
                key,
            )
        event = ReceivedWebhook(
            key, int(headers["webhook-timestamp"]), payload, body, token, route.strip("/")
        )
        return await self._run(event, terms.holder)

    async def _renew_lease(self, key: str, holder: str) -> None:
        """While the handler runs: extend its lease every third of ``handler_lease_s``."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            try:
                held = await self.store.renew(key, holder, self._clock() + self._lease_s)
            except StoreUnavailable:
                log.warning("could not renew the handler lease of webhook-id %s", key)
                continue
            if not held:
                log.warning(
                    "webhook-id %s: this run's handler lease ran out and the key was "
                    "reclaimed; its outcome will not be recorded",
                    key,
                )
                return

    async def _run(self, event: ReceivedWebhook, holder: str) -> Reply:
        settled = self._settled.setdefault(event.webhook_id, asyncio.Event())
        heartbeat = asyncio.create_task(self._renew_lease(event.webhook_id, holder))
        try:
            try:
                with _TRACER.start_as_current_span(
                    "ledger.receiver.handler",
                    attributes={
                        "ledger.idempotency_key": event.webhook_id,
                        "ledger.fencing_token": -1
                        if event.fencing_token is None
                        else event.fencing_token,
                        "ledger.receiver.route": event.route,
                    },
                ):
                    result = self._handler(event)
                    if inspect.isawaitable(result):
                        result = await result
            except Exception as exc:
                # The exception's text may hold anything (even secrets): log it, answer its type.
                log.exception("handler failed for webhook-id %s", event.webhook_id)
                with contextlib.suppress(StoreUnavailable):  # the key stays "processing"
                    await self.store.fail(event.webhook_id, type(exc).__name__, holder)
                return Reply(
                    500,
                    {
                        "error": f"the handler failed ({type(exc).__name__}); "
                        "the next attempt runs it again",
                        "webhook_id": event.webhook_id,
                    },
                )
            result_id = str(result)
            heartbeat.cancel()
            try:
                if not await self.store.complete(event.webhook_id, result_id, holder):
                    log.error(
                        "webhook-id %s: the handler returned after its lease was reclaimed "
                        "by another run; this run's result %s is not recorded",
                        event.webhook_id,
                        result_id,
                    )
            except StoreUnavailable:
                # The handler ran: say so. The key stays "processing" in the store (a
                # retry waits, a lookup answers 202), never "not found": no second run.
                log.error(
                    "could not record the result of webhook-id %s: the store is unreachable",
                    event.webhook_id,
                )
            return _done(event.webhook_id, result_id, duplicate=False)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            settled.set()
            self._settled.pop(event.webhook_id, None)

    async def _await_first(self, key: str) -> Reply:
        """Another request is running the handler: wait (bounded) for its answer.

        A run in this process wakes its waiters at once; one in another process is seen
        by polling the store, backing off so that many waiters do not flood it.
        """
        deadline = time.monotonic() + self._wait_s
        pause = 0.05
        for _ in range(MAX_POLLS):
            record = await self.store.get(key)
            if record is not None and record.status is KeyStatus.DONE:
                return _done(key, record.result_id, duplicate=True)
            remaining = deadline - time.monotonic()
            if record is None or record.status is not KeyStatus.PROCESSING or remaining <= 0:
                break
            local = self._settled.get(key)
            if local is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(local.wait(), timeout=remaining)
            else:
                await asyncio.sleep(min(remaining, pause))
                pause = min(pause * 2, 1.0)
        return Reply(
            409,
            {
                "status": LookupStatus.PROCESSING.value,
                "error": "a request with this webhook-id is still being processed",
                "webhook_id": key,
            },
            {"Retry-After": "1"},
        )

    async def lookup(self, key: str, headers: Mapping[str, str]) -> Reply:
        """The lookup contract: 401 unless signed with one of our secrets and fresh; then
        200 done + id, 202 processing, 404 not received (or failed, or a dead run's key of
        an idempotent handler), 409 stuck (a dead run's key of a handler not declared
        idempotent). A span ``ledger.receiver.lookup``, like ``receive``'s."""
        with _TRACER.start_as_current_span(
            "ledger.receiver.lookup",
            context=_parent(headers),
            kind=trace.SpanKind.SERVER,
            attributes={"ledger.idempotency_key": key[:200]},
        ) as span:
            reply = await self._lookup(key, headers)
            span.set_attribute("http.response.status_code", reply.status)
            return reply

    async def _lookup(self, key: str, headers: Mapping[str, str]) -> Reply:
        now = self._clock()
        problem = self.verifier.lookup_problem(headers, key, now=now)
        if problem is not None:
            return Reply(401, {"error": "invalid lookup signature", "detail": problem})
        try:
            return await lookup_reply(
                self.store, key, now=now, idempotent_handler=self.idempotent_handler
            )
        except StoreUnavailable as exc:
            return _unavailable(key, exc)


def _parent(headers: Mapping[str, str]) -> Context | None:
    """The sender's trace context, unless the application's own server span (an
    instrumented framework) is current already: then that one, itself its child."""
    if trace.get_current_span().get_span_context().is_valid:
        return None
    traceparent = headers.get("traceparent")
    return None if traceparent is None else _W3C.extract({"traceparent": traceparent})


async def lookup_reply(
    store: IdempotencyStore,
    key: str,
    *,
    now: float | None = None,
    idempotent_handler: bool = False,
) -> Reply:
    """The lookup contract's answer for ``key`` from ``store``, for a lookup already
    authenticated (``WebhookReceiver.lookup`` checks the signature first). A key whose
    run died (lease expired) is ``failed`` if the handler is idempotent (the next request
    runs it again), else ``stuck``."""
    record = await store.get(key)
    at = time.time() if now is None else now
    if record is None:
        status = LookupStatus.NOT_FOUND
    elif lease_expired(record, at):
        status = LookupStatus.FAILED if idempotent_handler else LookupStatus.STUCK
    elif record.status is KeyStatus.PROCESSING:
        status = LookupStatus.PROCESSING
    elif record.status is KeyStatus.FAILED:
        status = LookupStatus.FAILED  # not done: a retry is safe and runs the handler again
    else:
        status = LookupStatus.DONE
    result_id = None if record is None else record.result_id
    return Reply(LOOKUP_HTTP_STATUS[status], dict(lookup_answer(status, key, result_id)))


def _unavailable(key: str, exc: StoreUnavailable) -> Reply:
    """Nothing was recorded and nothing ran: a later attempt is safe."""
    return Reply(
        503,
        {
            "error": "the idempotency store is unavailable; try again",
            "detail": str(exc),
            "webhook_id": key,
        },
        {"Retry-After": str(RETRY_AFTER_S)},
    )


def _stuck(key: str) -> Reply:
    """A dead run's key of a handler not declared idempotent: nothing runs, nothing is
    claimed; the ledger looks up (a 409 is not a success) and hands it to an operator."""
    return Reply(
        409,
        {
            "status": LookupStatus.STUCK.value,
            "error": "the handler for this webhook-id died while processing it and is not "
            "declared idempotent: it is not run again; an operator settles this key",
            "webhook_id": key,
        },
    )


def _done(key: str, result_id: str | None, *, duplicate: bool) -> Reply:
    return Reply(200, {"id": result_id, "webhook_id": key, "duplicate": duplicate})
