"""The simulated receiver and provider: request handlers, dedupe, lookups, fault application."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from events.contract import (
    FENCING_TOKEN_HEADER,
    LOOKUP_HTTP_STATUS,
    LookupStatus,
    parse_fencing_token,
    secret_key,
)
from ledger.simulator.faults import Fault, FaultKind, FaultPlan
from ledger.simulator.kit_hooks import KitHooks, lookup_result, send_result
from ledger.simulator.records import AcceptedEvent, Recorder, RequestRecord
from receiver.verification import LIBRARY_TOLERANCE_S, SignatureVerifier

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
NO_SECRET = "the receiver has no webhook secret configured"  # noqa: S105 - a message


class SimulatorConfig(BaseModel):
    """How the simulator listens and behaves; the behaviour fields can change at run time."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    control_port: int | None = Field(default=0, ge=0, le=65535)  # None: no separate listener
    # The Standard Webhooks secret hooks are verified with (no default: the ledger has no
    # built-in secret either; without one every hook is answered 401).
    webhook_secret: str | None = None
    hook_secrets: dict[str, str] = Field(default_factory=dict)  # per /hooks/{name}
    # "kit": /hooks are receiver-kit apps (the kit verifies, dedupes on webhook-id, refuses
    # stale fencing tokens, answers lookups 200/202/404); "plain": the simulator's own.
    hooks: Literal["kit", "plain"] = "plain"
    # False: every valid request is processed (to expose double sends). With hooks="kit"
    # it applies to the provider only: the kit always dedupes.
    dedupe: bool = True
    delivered_after_s: float | None = Field(default=0.5, ge=0)  # None: stays "queued"
    # Lookups answer 202 {"status": "processing"} while a request for the key is still
    # being processed (the receiver kit's contract); plain receivers answer 404 then.
    lookup_processing: bool = False
    # Freshness window; the standardwebhooks library allows at most 5 minutes.
    timestamp_tolerance_s: float = Field(default=LIBRARY_TOLERANCE_S, gt=0, le=LIBRARY_TOLERANCE_S)

    @field_validator("webhook_secret")
    @classmethod
    def _secret_long_enough(cls, value: str | None) -> str | None:
        if value is not None:
            secret_key(value)  # ValueError: too short or not base64, never the secret
        return value

    @field_validator("hook_secrets")
    @classmethod
    def _hook_secrets_long_enough(cls, value: dict[str, str]) -> dict[str, str]:
        for name, secret in value.items():
            try:
                secret_key(secret)
            except ValueError as exc:
                raise ValueError(f"hook_secrets[{name!r}]: {exc}") from None
        return value

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        if value not in LOOPBACK:
            raise ValueError("the simulator listens on loopback only (127.0.0.1, ::1)")
        return value


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NO_RESPONSE = object()


def _processing_answer() -> web.Response:
    status = LookupStatus.PROCESSING
    return web.json_response({"status": status.value}, status=LOOKUP_HTTP_STATUS[status])


def _fencing_token(raw: str | None) -> int | None:
    """The request's fencing token as recorded, None if absent or malformed."""
    try:
        return None if raw is None else parse_fencing_token(raw)
    except ValueError:
        return None


def _abort(request: web.Request, *, reset: bool) -> None:
    """Close the connection under a request without answering (FIN, or RST if ``reset``)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if reset and sock is not None:
        # Linger 0 turns close() into an RST: the client sees "connection reset".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


class Receiver:
    """Everything the simulator does with a request; state is shared with the control API."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.recorder = Recorder()
        self.faults = FaultPlan()
        self.kit = KitHooks(self.recorder) if config.hooks == "kit" else None
        self._verifiers: dict[tuple[tuple[str, ...], float], SignatureVerifier] = {}

    def verifier(self, secrets: Sequence[str]) -> SignatureVerifier | None:
        """The receiver kit's verifier of ``secrets`` under the configured tolerance (None
        without a secret): the simulator verifies exactly as a customer's kit does."""
        if not secrets:
            return None
        key = (tuple(secrets), self.config.timestamp_tolerance_s)
        verifier = self._verifiers.get(key)
        if verifier is None:
            verifier = self._verifiers[key] = SignatureVerifier(secrets, tolerance_s=key[1])
        return verifier

    async def start(self) -> None:
        """Open what the receivers keep (the kit's store)."""
        if self.kit is not None:
            await self.kit.start()

    async def stop(self) -> None:
        """Close it again."""
        if self.kit is not None:
            await self.kit.stop()

    async def reset(self) -> None:
        """Disarm every fault and forget every request, event and kit record."""
        self.faults.clear()
        self.recorder.reset()
        if self.kit is not None:
            await self.kit.reset()

    # -- helpers ---------------------------------------------------------------------------

    def _processing(self, key: str) -> bool:
        return self.config.lookup_processing and self.recorder.in_progress(key)

    def provider_status(self, event: AcceptedEvent) -> str:
        """``queued`` until ``delivered_after_s`` has passed since acceptance, then delivered."""
        if event.status_override is not None:
            return event.status_override
        after = self.config.delivered_after_s
        if after is None or time.monotonic() - event.monotonic_at < after:
            return "queued"
        return "delivered"

    async def _guarded(
        self,
        request: web.Request,
        key: str | None,
        body: Callable[
            [bytes, RequestRecord, Fault | None], Awaitable[web.StreamResponse | object]
        ],
    ) -> web.StreamResponse:
        """Log the request, pick its fault, apply the faults that answer before processing."""
        record = self.recorder.received(request.method, request.path, key)
        record.fencing_token = _fencing_token(request.headers.get(FENCING_TOKEN_HEADER))
        fault = self.faults.take(request.method, request.path, key)
        record.fault = fault.kind.value if fault else None
        if fault is not None and fault.kind in (FaultKind.REJECT, FaultKind.RATE_LIMIT):
            status = fault.response_status()
            headers = (
                {"Retry-After": fault.retry_after} if fault.kind is FaultKind.RATE_LIMIT else {}
            )
            result = "rate_limited" if fault.kind is FaultKind.RATE_LIMIT else "rejected"
            self.recorder.finish(record, result, status)
            return web.json_response(
                {"error": f"injected {fault.kind}"}, status=status, headers=headers
            )
        try:
            # Read the whole request before any delay: a slow receiver has the bytes even
            # when the client has given up waiting for the answer.
            raw = await request.read()
        except ConnectionError:
            self.recorder.finish(record, "client_gone", None)
            return web.Response(status=499)
        if fault is not None and fault.kind is FaultKind.DELAY and not fault.accept_first:
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.kind is FaultKind.STALL:
            # Sat on it, then gave up without processing it.
            await asyncio.sleep(fault.delay_s)
            status = fault.response_status()
            self.recorder.finish(record, "stalled", status)
            return web.json_response({"error": "injected stall; not processed"}, status=status)
        response = await body(raw, record, fault)
        if response is _NO_RESPONSE:
            # The transport is closed; aiohttp gets a response it can no longer write.
            return web.Response(status=499)
        assert isinstance(response, web.StreamResponse)
        return response

    async def _after_accept(
        self,
        request: web.Request,
        record: RequestRecord,
        fault: Fault | None,
        result: str,
        ok: web.Response,
    ) -> web.StreamResponse | object:
        """Apply the faults that strike after the event was accepted, else answer ``ok``."""
        if fault is None:
            self.recorder.finish(record, result, ok.status)
            return ok
        if fault.kind is FaultKind.DELAY:
            await asyncio.sleep(fault.delay_s)
        elif fault.kind in (FaultKind.DROP, FaultKind.RESET):
            self.recorder.finish(record, result, None)
            _abort(request, reset=fault.kind is FaultKind.RESET)
            return _NO_RESPONSE
        elif fault.kind is FaultKind.TRICKLE:
            return await self._trickle(request, record, fault, result, ok)
        elif fault.kind is FaultKind.ERROR_AFTER_ACCEPT:
            status = fault.response_status()
            self.recorder.finish(record, result, status)
            return web.json_response({"error": "injected error after accepting"}, status=status)
        self.recorder.finish(record, result, ok.status)
        return ok

    async def _trickle(
        self,
        request: web.Request,
        record: RequestRecord,
        fault: Fault,
        result: str,
        ok: web.Response,
    ) -> web.StreamResponse:
        """Answer the status at once, then the body a byte at a time over ``delay_s``."""
        body = ok.body if isinstance(ok.body, bytes) else b"{}"
        response = web.StreamResponse(status=ok.status)
        response.content_type = "application/json"
        response.content_length = len(body)
        await response.prepare(request)
        self.recorder.finish(record, result, ok.status)
        pause = fault.delay_s / max(len(body), 1)
        try:
            for byte in body:
                await response.write(bytes([byte]))
                await asyncio.sleep(pause)
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client gave up on the body: its status had arrived
        finally:
            self.recorder.ended(record)
        return response

    @staticmethod
    def _invalid(
        record: RequestRecord, recorder: Recorder, result: str, status: int, why: str
    ) -> web.Response:
        recorder.finish(record, result, status)
        return web.json_response({"error": why}, status=status)

    @staticmethod
    def _json(body: bytes) -> tuple[Any, str | None]:
        try:
            return json.loads(body), None
        except ValueError:
            return None, "body is not JSON"

    # -- webhook receiver ------------------------------------------------------------------

    async def hook(self, request: web.Request) -> web.StreamResponse:
        """POST /hooks/{name}: verify the Standard Webhooks signature, dedupe by webhook-id."""
        key = request.headers.get("webhook-id")

        async def body(
            raw: bytes, record: RequestRecord, fault: Fault | None
        ) -> web.StreamResponse | object:
            name = request.match_info["name"]
            secret = self.config.hook_secrets.get(name, self.config.webhook_secret)
            if self.kit is not None:
                return await self._kit_hook(request, record, fault, secret, raw)
            verifier = self.verifier([] if secret is None else [secret])
            problem = (
                NO_SECRET
                if verifier is None
                else verifier.problem(request.headers, raw, now=time.time())
            )
            record.signature_ok = problem is None
            if problem is not None or key is None:
                return self._invalid(
                    record, self.recorder, "unauthorized", 401, problem or "no webhook-id"
                )
            payload, error = self._json(raw)
            if error:
                return self._invalid(record, self.recorder, "invalid", 400, error)
            event, new = self.recorder.accept(
                key, "webhook", request.path, payload, dedupe=self.config.dedupe, id_prefix="evt"
            )
            ok = web.json_response(
                {"id": event.receiver_id, "webhook_id": key, "duplicate": not new}
            )
            return await self._after_accept(
                request, record, fault, "accepted" if new else "duplicate", ok
            )

        return await self._guarded(request, key, body)

    async def _kit_hook(
        self,
        request: web.Request,
        record: RequestRecord,
        fault: Fault | None,
        secret: str | None,
        raw: bytes,
    ) -> web.StreamResponse | object:
        """The kit decides; faults that strike after acceptance apply to its answer."""
        assert self.kit is not None
        if secret is None:
            record.signature_ok = False
            return self._invalid(record, self.recorder, "unauthorized", 401, NO_SECRET)
        reply = await self.kit.receive(
            secret,
            self.config.timestamp_tolerance_s,
            request.headers,
            raw,
            request.match_info["name"],
        )
        record.signature_ok = reply.status != 401
        result = send_result(reply)
        answer = web.json_response(reply.body, status=reply.status, headers=reply.headers)
        if result in ("accepted", "duplicate"):
            return await self._after_accept(request, record, fault, result, answer)
        self.recorder.finish(record, result, reply.status)
        return answer

    async def hook_lookup(self, request: web.Request) -> web.StreamResponse:
        """GET /hooks/lookup/{key}: 401 unless signed; 200 with the receiver's id if
        accepted, else 404."""
        key = request.match_info["key"]

        async def body(
            raw: bytes, record: RequestRecord, fault: Fault | None
        ) -> web.StreamResponse | object:
            # Lookups are authenticated (the lookup contract): signed with any hook's secret.
            secrets = [*self.config.hook_secrets.values()]
            if self.config.webhook_secret is not None:
                secrets.append(self.config.webhook_secret)
            verifier = self.verifier(secrets)
            problem = (
                NO_SECRET
                if verifier is None
                else verifier.lookup_problem(request.headers, key, now=time.time())
            )
            if problem is not None:
                return self._invalid(record, self.recorder, "unauthorized", 401, problem)
            if self.kit is not None:
                reply = await self.kit.lookup(key)
                answer = web.json_response(reply.body, status=reply.status)
                return await self._after_accept(
                    request, record, fault, lookup_result(reply), answer
                )
            event = self.recorder.event(key)
            if event is None and self._processing(key):
                return await self._after_accept(
                    request, record, fault, "processing", _processing_answer()
                )
            if event is None or event.channel != "webhook":
                ok = web.json_response({"error": "not found", "webhook_id": key}, status=404)
                return await self._after_accept(request, record, fault, "not_found", ok)
            found = {"id": event.receiver_id, "webhook_id": key, "status": "delivered"}
            return await self._after_accept(
                request, record, fault, "found", web.json_response(found)
            )

        return await self._guarded(request, key, body)

    # -- provider API ----------------------------------------------------------------------

    async def provider_send(self, request: web.Request) -> web.StreamResponse:
        """POST /provider/messages: dedupe by Idempotency-Key; answer id + queued/delivered."""
        key = request.headers.get("idempotency-key")

        async def body(
            raw: bytes, record: RequestRecord, fault: Fault | None
        ) -> web.StreamResponse | object:
            if not key:
                return self._invalid(
                    record, self.recorder, "invalid", 400, "Idempotency-Key is required"
                )
            payload, error = self._json(raw)
            if error:
                return self._invalid(record, self.recorder, "invalid", 400, error)
            event, new = self.recorder.accept(
                key, "provider", request.path, payload, dedupe=self.config.dedupe, id_prefix="msg"
            )
            answer = {
                "id": event.receiver_id,
                "status": self.provider_status(event),
                "idempotency_key": key,
            }
            ok = web.json_response(answer, status=201 if new else 200)
            if fault is not None and fault.kind is FaultKind.PROVIDER_FAILED:
                event.status_override = "failed"  # queued now; failed when looked up
            return await self._after_accept(
                request, record, fault, "accepted" if new else "duplicate", ok
            )

        return await self._guarded(request, key, body)

    async def provider_lookup(self, request: web.Request) -> web.StreamResponse:
        """GET /provider/messages?idempotency_key=K: 200 {id, status} or 404."""
        key = request.query.get("idempotency_key")

        async def body(
            raw: bytes, record: RequestRecord, fault: Fault | None
        ) -> web.StreamResponse | object:
            if not key:
                return self._invalid(
                    record, self.recorder, "invalid", 400, "idempotency_key is required"
                )
            event = self.recorder.event(key)
            if event is None and self._processing(key):
                return await self._after_accept(
                    request, record, fault, "processing", _processing_answer()
                )
            if event is None or event.channel != "provider":
                ok = web.json_response({"error": "not found", "idempotency_key": key}, status=404)
                return await self._after_accept(request, record, fault, "not_found", ok)
            found = {
                "id": event.receiver_id,
                "status": self.provider_status(event),
                "idempotency_key": key,
            }
            return await self._after_accept(
                request, record, fault, "found", web.json_response(found)
            )

        return await self._guarded(request, key, body)

    def routes(self) -> list[web.RouteDef]:
        """The receiver's and provider's routes."""
        return [
            web.get("/hooks/lookup/{key}", self.hook_lookup),
            web.post("/hooks/{name}", self.hook),
            web.post("/provider/messages", self.provider_send),
            web.get("/provider/messages", self.provider_lookup),
        ]
