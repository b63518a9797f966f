"""The receiver's side of the protocol, framework-neutral: verify, dedupe, fence, look up.

``WebhookReceiver.receive`` takes the request's headers and raw body and returns a
``Reply`` (status, JSON body, headers) that an adapter (``receiver.asgi``,
``receiver.aiohttp_adapter``) writes out. The key is recorded before the handler runs,
so a lookup never says "not found" about a request that is being processed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from events.contract import (
    FENCING_TOKEN_HEADER,
    LOOKUP_HTTP_STATUS,
    LookupStatus,
    lookup_answer,
    parse_fencing_token,
)
from receiver.records import Admission, KeyStatus
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
    ``id`` of every later answer for that key and of the lookup.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        secrets: list[str] | tuple[str, ...],
        store: IdempotencyStore,
        tolerance_s: float = 300.0,
        in_progress_wait_s: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._handler = handler
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
        409 stale token, else the answer."""
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
        try:
            decision = await self.store.admit(key, token)
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
        if decision.admission is Admission.IN_PROGRESS:
            try:
                return await self._await_first(key)
            except StoreUnavailable as exc:
                return _unavailable(key, exc)
        event = ReceivedWebhook(
            key, int(headers["webhook-timestamp"]), payload, body, token, route.strip("/")
        )
        return await self._run(event)

    async def _run(self, event: ReceivedWebhook) -> Reply:
        settled = self._settled.setdefault(event.webhook_id, asyncio.Event())
        try:
            try:
                result = self._handler(event)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:
                # The exception's text may hold anything (even secrets): log it, answer its type.
                log.exception("handler failed for webhook-id %s", event.webhook_id)
                with contextlib.suppress(StoreUnavailable):  # the key stays "processing"
                    await self.store.fail(event.webhook_id, type(exc).__name__)
                return Reply(
                    500,
                    {
                        "error": f"the handler failed ({type(exc).__name__}); "
                        "the next attempt runs it again",
                        "webhook_id": event.webhook_id,
                    },
                )
            result_id = str(result)
            try:
                await self.store.complete(event.webhook_id, result_id)
            except StoreUnavailable:
                # The handler ran: say so. The key stays "processing" in the store (a
                # retry waits, a lookup answers 202), never "not found": no second run.
                log.error(
                    "could not record the result of webhook-id %s: the store is unreachable",
                    event.webhook_id,
                )
            return _done(event.webhook_id, result_id, duplicate=False)
        finally:
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
        200 done + id, 202 processing, 404 not received (or failed)."""
        problem = self.verifier.lookup_problem(headers, key, now=self._clock())
        if problem is not None:
            return Reply(401, {"error": "invalid lookup signature", "detail": problem})
        try:
            return await lookup_reply(self.store, key)
        except StoreUnavailable as exc:
            return _unavailable(key, exc)


async def lookup_reply(store: IdempotencyStore, key: str) -> Reply:
    """The lookup contract's answer for ``key`` from ``store``, for a lookup already
    authenticated (``WebhookReceiver.lookup`` checks the signature first)."""
    record = await store.get(key)
    if record is None:
        status = LookupStatus.NOT_FOUND
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


def _done(key: str, result_id: str | None, *, duplicate: bool) -> Reply:
    return Reply(200, {"id": result_id, "webhook_id": key, "duplicate": duplicate})
