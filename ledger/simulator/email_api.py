"""A fake HTTP email API on loopback, shaped like the common providers (Resend-like).

``POST /emails`` (JSON ``from``, ``to``, ``subject``, ``text``/``html``, ``headers``;
``Authorization: Bearer``; ``Idempotency-Key``) answers ``{"id": ...}``; ``GET /emails/{id}``
shows a message and its ``status``; ``GET /emails?idempotency_key=K`` finds the message a
request with that key made (this API shape's contract; real providers differ: Resend gets
by id only, so the fake can be told not to offer it). Errors as ``{statusCode, name,
message}``: 401 ``missing_api_key``/``invalid_api_key``, 422 ``validation_error``, 429
``rate_limit_exceeded`` with ``Retry-After``, 404 ``not_found``.

A message's status moves with time: ``queued``, then ``sent`` (handed to the recipient's
server), then ``delivered`` after ``deliver_after_s`` — or ``bounced`` (with the provider's
reason) when a bounce fault was armed for it.

It keeps every accepted message and does NOT dedupe unless told (``dedupe``): a second
request with the same key is a second message, so a double send shows. With ``dedupe`` on
it honours ``Idempotency-Key`` for ``dedupe_window_s`` as the providers do: a repeat
answers the first message's id and sends nothing; a repeat with another body is 409
``invalid_idempotent_request``. Faults on command: a timeout or a 500 after accepting, 429,
a 422 rejection, a bounce.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from ledger.simulator.app_server import AppServer

MAX_BODY = 256 * 1024


class EmailFaultKind(enum.StrEnum):
    """What goes wrong with one send, and whether the message was accepted first."""

    TIMEOUT_AFTER_ACCEPT = "timeout_after_accept"  # accepted, answered only after delay_s
    ERROR_AFTER_ACCEPT = "error_after_accept"  # accepted, then HTTP `status` (500)
    RATELIMITED = "ratelimited"  # 429 + Retry-After; nothing accepted
    REJECT = "reject"  # 422 validation_error with `message`; nothing accepted
    BOUNCE = "bounce"  # accepted; its status ends `bounce_status` with `reason`


class EmailFault(BaseModel):
    """A fault for the next ``count`` sends matching ``key`` (the Idempotency-Key) and ``to``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: EmailFaultKind
    count: int = Field(default=1, ge=1, le=1_000_000)
    key: str | None = None
    to: str | None = None
    delay_s: float = Field(default=10.0, ge=0, le=300)
    status: int = Field(default=500, ge=500, le=599)
    retry_after: int = Field(default=1, ge=0, le=3600)
    message: str = "The `to` field contains an address the provider refuses."
    bounce_status: str = Field(default="bounced", pattern=r"^(bounced|failed|complained)$")
    reason: str = "550 5.1.1 The email account that you tried to reach does not exist"


class FakeEmailApiConfig(BaseModel):
    """Where it listens, its API keys, and how it behaves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    api_keys: list[str] = Field(default_factory=list)
    # Seconds from acceptance to ``delivered`` (``sent`` from half of it).
    deliver_after_s: float = Field(default=1.0, ge=0, le=86400)
    # Instead, when set: ``sent`` until the message was looked up this many times, and
    # its final status from that lookup on (a test's deterministic "delivered later").
    deliver_after_reads: int | None = Field(default=None, ge=1)
    # Honour Idempotency-Key (off: a repeat is a second message, so a double send shows).
    dedupe: bool = False
    dedupe_window_s: float = Field(default=86400.0, gt=0)
    # Offer GET /emails?idempotency_key=K (off: answered 400, as by a provider without it).
    lookup_by_key: bool = True


@dataclass
class EmailMessage:
    """One accepted message, as the provider keeps it."""

    id: str
    key: str | None
    sender: str
    to: list[str]
    subject: str
    text: str | None
    html: str | None
    headers: dict[str, str]
    created_at: float
    body_hash: str
    final_status: str = "delivered"
    reason: str | None = None
    reads: int = 0  # how many lookups have shown it

    def status(self, now: float, config: FakeEmailApiConfig) -> str:
        """queued, sent, then the final status once ``deliver_after_s`` has passed (or it
        was read ``deliver_after_reads`` times)."""
        if config.deliver_after_reads is not None:
            return self.final_status if self.reads >= config.deliver_after_reads else "sent"
        age = now - self.created_at
        if age >= config.deliver_after_s:
            return self.final_status
        return "sent" if age >= config.deliver_after_s / 2 else "queued"

    def shown(self, now: float, config: FakeEmailApiConfig) -> dict[str, Any]:
        """The message as ``GET /emails/{id}`` shows it."""
        status = self.status(now, config)
        shown: dict[str, Any] = {
            "object": "email",
            "id": self.id,
            "from": self.sender,
            "to": self.to,
            "subject": self.subject,
            "created_at": self.created_at,
            "status": status,
            "last_event": status,
        }
        if status == self.final_status and self.reason is not None:
            shown["reason"] = self.reason
        return shown


@dataclass(frozen=True)
class EmailCall:
    """One API call as the fake saw it."""

    method: str
    path: str
    key: str | None
    status: int
    at: float


@dataclass
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    messages: list[EmailMessage] = field(default_factory=list)
    # Idempotency-Key -> (the message it made, when), while dedupe is on.
    remembered: dict[str, tuple[EmailMessage, float]] = field(default_factory=dict)
    calls: list[EmailCall] = field(default_factory=list)
    faults: list[tuple[EmailFault, int]] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class ApiError(Exception):
    """An error answer: ``{statusCode, name, message}``."""

    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.name = name
        self.message = message

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        body = {"statusCode": self.status, "name": self.name, "message": self.message}
        return web.json_response(body, status=self.status, headers=headers)


class FakeEmailApi:
    """The fake email API server; ``async with`` starts and stops it. Thread-safe reads."""

    def __init__(self, config: FakeEmailApiConfig | None = None) -> None:
        self.config = config or FakeEmailApiConfig()
        self.port = 0
        self._state = _State()
        self._server = AppServer()

    @property
    def api_url(self) -> str:
        """The API base (``LEDGER_CHANNELS__SETTINGS[email_api].api_url``)."""
        return f"http://{self.config.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the port and serve."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/emails", self._send)
        app.router.add_get("/emails", self._by_key)
        app.router.add_get("/emails/{id}", self._by_id)
        self.port = await self._server.serve(app, self.config.host, self.config.port)

    async def stop(self) -> None:
        """Stop serving."""
        await self._server.stop()

    async def __aenter__(self) -> FakeEmailApi:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    # -- control and observation (any thread) ------------------------------------------------

    def fault(self, kind: EmailFaultKind | str, **fields: Any) -> EmailFault:
        """Arm a fault for the next matching sends (count, key, to, delay_s, ...)."""
        fault = EmailFault(kind=EmailFaultKind(kind), **fields)
        with self._state.lock:
            self._state.faults.append((fault, fault.count))
        return fault

    def messages(self, key: str | None = None) -> list[EmailMessage]:
        """Every accepted message (with ``key``: those its Idempotency-Key made), oldest first."""
        with self._state.lock:
            return [m for m in self._state.messages if key is None or m.key == key]

    def calls(self, method: str | None = None, key: str | None = None) -> list[EmailCall]:
        """The call log, optionally by HTTP method and Idempotency-Key."""
        with self._state.lock:
            calls = list(self._state.calls)
        return [c for c in calls if method in (None, c.method) and key in (None, c.key)]

    # -- the API ------------------------------------------------------------------------------

    def _authenticate(self, request: web.Request) -> None:
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer ") or not header[7:].strip():
            raise ApiError(401, "missing_api_key", "Missing API key in the authorization header")
        if header[7:].strip() not in self.config.api_keys:
            raise ApiError(403, "invalid_api_key", "API key is invalid")

    def _record(self, request: web.Request, key: str | None, status: int) -> None:
        with self._state.lock:
            self._state.calls.append(
                EmailCall(request.method, request.path, key, status, time.monotonic())
            )

    async def _send(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("idempotency-key") or None
        try:
            self._authenticate(request)
            message = await _parse(request, key)
            fault = self._take_fault(key, message.to)
            if fault is not None and fault.kind is EmailFaultKind.RATELIMITED:
                raise ApiError(429, "rate_limit_exceeded", "Too many requests")
            if fault is not None and fault.kind is EmailFaultKind.REJECT:
                raise ApiError(422, "validation_error", fault.message)
            accepted = self._accept(message, key, fault)
        except ApiError as exc:
            self._record(request, key, exc.status)
            headers = None
            if exc.status == 429:
                retry_after = fault.retry_after if fault is not None else 1
                headers = {"Retry-After": str(retry_after)}
            return exc.response(headers)
        if fault is not None and fault.kind is EmailFaultKind.ERROR_AFTER_ACCEPT:
            self._record(request, key, fault.status)
            error = ApiError(fault.status, "internal_server_error", "An unexpected error occurred")
            return error.response()
        # Recorded before a late answer: the client may hang up and cancel this handler.
        self._record(request, key, 200)
        if fault is not None and fault.kind is EmailFaultKind.TIMEOUT_AFTER_ACCEPT:
            await asyncio.sleep(fault.delay_s)
        return web.json_response({"id": accepted.id})

    def _take_fault(self, key: str | None, to: list[str]) -> EmailFault | None:
        with self._state.lock:
            for index, (fault, left) in enumerate(self._state.faults):
                if fault.key not in (None, key) or (fault.to is not None and fault.to not in to):
                    continue
                if left <= 1:
                    del self._state.faults[index]
                else:
                    self._state.faults[index] = (fault, left - 1)
                return fault
        return None

    def _accept(
        self, message: EmailMessage, key: str | None, fault: EmailFault | None
    ) -> EmailMessage:
        now = time.time()
        with self._state.lock:
            if self.config.dedupe and key is not None:
                first = self._state.remembered.get(key)
                if first is not None and now - first[1] < self.config.dedupe_window_s:
                    if first[0].body_hash != message.body_hash:
                        raise ApiError(
                            409,
                            "invalid_idempotent_request",
                            "Same idempotency key used with a different request payload",
                        )
                    return first[0]
            message.id = f"em_{next(self._state.ids):08d}"
            message.created_at = now
            if fault is not None and fault.kind is EmailFaultKind.BOUNCE:
                message.final_status = fault.bounce_status
                message.reason = fault.reason
            self._state.messages.append(message)
            if self.config.dedupe and key is not None:
                self._state.remembered[key] = (message, now)
        return message

    def _found(self, request: web.Request, key: str | None, message: EmailMessage) -> web.Response:
        self._record(request, key, 200)
        with self._state.lock:
            message.reads += 1
            shown = message.shown(time.time(), self.config)
        return web.json_response(shown)

    async def _by_id(self, request: web.Request) -> web.Response:
        try:
            self._authenticate(request)
            wanted = request.match_info["id"]
            for message in self.messages():
                if message.id == wanted:
                    return self._found(request, message.key, message)
            raise ApiError(404, "not_found", "Email not found")
        except ApiError as exc:
            self._record(request, None, exc.status)
            return exc.response()

    async def _by_key(self, request: web.Request) -> web.Response:
        key = request.query.get("idempotency_key")
        try:
            self._authenticate(request)
            if not self.config.lookup_by_key:
                raise ApiError(
                    400, "invalid_parameter", "listing by idempotency_key is not offered"
                )
            if not key:
                raise ApiError(422, "validation_error", "idempotency_key is required")
            found = self.messages(key)
            if not found:
                raise ApiError(404, "not_found", "No email was sent with this idempotency key")
            answer = self._found(request, key, found[0])
            # The fake's own addition (no provider says it): how many messages this key
            # made, so a tester sees a double send where dedupe is off.
            answer.headers["X-Fake-Messages-With-Key"] = str(len(found))
            return answer
        except ApiError as exc:
            self._record(request, key, exc.status)
            return exc.response()


async def _parse(request: web.Request, key: str | None) -> EmailMessage:
    """The request's message, validated as the providers do (422 ``validation_error``)."""
    if request.content_type != "application/json":
        raise ApiError(422, "validation_error", "the body must be JSON (application/json)")
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(422, "validation_error", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(422, "validation_error", "the body must be a JSON object")
    sender, to, subject = body.get("from"), body.get("to"), body.get("subject")
    if isinstance(to, str):
        to = [to]
    if not isinstance(sender, str) or "@" not in sender:
        raise ApiError(422, "validation_error", "`from` must be an email address")
    if not isinstance(to, list) or not to or not all(isinstance(t, str) and "@" in t for t in to):
        raise ApiError(422, "validation_error", "`to` must be one or more email addresses")
    if not isinstance(subject, str) or not subject:
        raise ApiError(422, "validation_error", "`subject` is required")
    text, html, headers = body.get("text"), body.get("html"), body.get("headers") or {}
    if not (isinstance(text, str) and text) and not (isinstance(html, str) and html):
        raise ApiError(422, "validation_error", "`text` or `html` is required")
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ApiError(422, "validation_error", "`headers` must map names to strings")
    return EmailMessage(
        id="",
        key=key,
        sender=sender,
        to=list(to),
        subject=subject,
        text=text if isinstance(text, str) else None,
        html=html if isinstance(html, str) else None,
        headers=dict(headers),
        created_at=0.0,
        body_hash=hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
    )
