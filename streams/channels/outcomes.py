"""How an HTTP attempt is classified: transport failures by when they happened, statuses by code.

The line that matters is whether any byte of the request may have left. httpx keeps
connect-phase failures (``ConnectError``, ``ConnectTimeout``, ``PoolTimeout``) apart from
failures after the connection carried the request (``WriteError``/``WriteTimeout``,
``ReadError``/``ReadTimeout``, ``RemoteProtocolError``); the first group is NOT_SENT
(safe to retry), the second UNKNOWN (reconcile first).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import JsonValue

from events.contract import LookupStatus
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.address_guard import BlockedAddress
from streams.channels.base import LookupResult, SendOutcome, SendResult
from streams.channels.excerpt import excerpt
from streams.channels.write_guard import SendRefused, WriteGuard, unguarded

MAX_BODY_BYTES = 64 * 1024  # a receiver's answer is small; never buffer an unbounded one

# httpcore's own message for EOF before any response byte (``RemoteProtocolError``).
_DISCONNECTED = "disconnected without sending a response"


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _connect_error_class(exc: httpx.ConnectError) -> ErrorClass:
    for cause in _causes(exc):
        if isinstance(cause, BlockedAddress):
            return ErrorClass.BLOCKED_ADDRESS
        if isinstance(cause, socket.gaierror):
            return ErrorClass.DNS_FAILURE
        if isinstance(cause, ConnectionRefusedError):
            return ErrorClass.CONNECT_REFUSED
    return ErrorClass.CONNECT_FAILED


def transport_failure(exc: httpx.RequestError, what: str) -> SendResult:
    """Classify an httpx exception raised before a response status arrived.

    ``what`` names the request in the evidence (``"POST http://..."``).
    """
    detail = f"{what}: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
    detail = detail[:1000]
    if isinstance(exc, httpx.ConnectTimeout):
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.CONNECT_TIMEOUT)
    if isinstance(exc, httpx.PoolTimeout):
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.POOL_TIMEOUT)
    if isinstance(exc, httpx.ConnectError):
        error_class = _connect_error_class(exc)
        if error_class is ErrorClass.BLOCKED_ADDRESS:
            # Nothing was sent, and nothing ever will be: the address stays what it is.
            return SendResult(SendOutcome.REJECTED, detail, error_class)
        return SendResult(SendOutcome.NOT_SENT, detail, error_class)
    if isinstance(exc, httpx.UnsupportedProtocol):
        return SendResult(SendOutcome.REJECTED, detail, ErrorClass.INVALID_RECIPIENT)
    if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
        # A write timeout can strike after most of the request is in the peer's buffers.
        return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.TIMEOUT_AFTER_WRITE)
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.RESET_AFTER_WRITE)
    if isinstance(exc, httpx.RemoteProtocolError) and _DISCONNECTED in str(exc).lower():
        return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.RESET_AFTER_WRITE)
    # Anything else happened on a live connection (malformed response, bad encoding): the
    # request may have been processed, so nothing here is ever "not sent".
    return SendResult(SendOutcome.UNKNOWN, detail, ErrorClass.PROTOCOL_ERROR)


def retry_after_seconds(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Parse ``Retry-After``: delay-seconds or an HTTP date (relative to ``now``); else None."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; an obsolete form may parse naive
        return None
    return max(0.0, when.timestamp() - now())


@dataclass(frozen=True)
class Answer:
    """A response whose status arrived: the headers, and at most MAX_BODY_BYTES of body."""

    status: int
    headers: httpx.Headers
    body: bytes
    # Set when the connection failed while the body was being read: the status still stands.
    body_error: str | None = None

    def json_object(self) -> dict[str, JsonValue] | None:
        """The body as a JSON object, or None if it is not one: whatever the receiver
        sent, including nesting deep enough to exhaust the parser (RecursionError), every
        caller classifies None and nothing raises."""
        try:
            value = json.loads(self.body)
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

    def excerpt(self) -> str:
        """A short, sanitized start of the body, for evidence (streams/channels/excerpt.py)."""
        text = excerpt(self.body)
        return f"{text} (body read failed: {self.body_error})" if self.body_error else text


class DeadlineExceeded(Exception):
    """The hard total deadline struck before the response status arrived."""

    def __init__(self, what: str, deadline_s: float, *, written: bool) -> None:
        super().__init__(f"{what}: no answer within the {deadline_s:g}s deadline")
        self.written = written


async def request(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    deadline_s: float,
    guard: WriteGuard | None = None,
    **kwargs: Any,
) -> Answer:
    """Make one request under a hard total deadline; read at most MAX_BODY_BYTES of body.

    ``guard`` runs right before the first byte is written and may refuse (``SendRefused``).
    Raises httpx.RequestError or ``DeadlineExceeded`` for failures before the status line
    arrived. Once the status is in, a body cut by the deadline or by the connection
    leaves the status standing (``Answer.body_error`` says what happened).
    """
    guard = guard if guard is not None else unguarded()
    loop = asyncio.get_running_loop()
    ends = loop.time() + deadline_s
    # httpcore runs the guard from its trace hook; the aiohttp transport reads it directly.
    extensions = {"trace": guard.trace, "write_guard": guard}
    built = client.build_request(method, url, extensions=extensions, **kwargs)
    try:
        async with asyncio.timeout_at(ends):
            response = await client.send(built, stream=True)
    except TimeoutError:
        raise DeadlineExceeded(f"{method} {url}", deadline_s, written=guard.written) from None
    body = bytearray()
    error: str | None = None
    try:
        async with asyncio.timeout_at(ends):
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) >= MAX_BODY_BYTES:
                    break
    except TimeoutError:
        error = f"the {deadline_s:g}s deadline struck while the body was being read"
    except httpx.RequestError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        # Closing a response whose body was not read to the end drops the connection.
        await response.aclose()
    return Answer(response.status_code, response.headers, bytes(body[:MAX_BODY_BYTES]), error)


def attempt_failure(exc: Exception, what: str) -> SendResult:
    """Classify why a request produced no status: refused, out of time, or transport."""
    if isinstance(exc, SendRefused):
        return SendResult(
            SendOutcome.NOT_SENT, f"{what}: not sent: {exc.reason}", ErrorClass.FENCED
        )
    if isinstance(exc, DeadlineExceeded):
        if exc.written:
            return SendResult(SendOutcome.UNKNOWN, str(exc), ErrorClass.TIMEOUT_AFTER_WRITE)
        return SendResult(SendOutcome.NOT_SENT, str(exc), ErrorClass.DEADLINE_BEFORE_WRITE)
    if isinstance(exc, httpx.InvalidURL):
        return SendResult(SendOutcome.REJECTED, f"{what}: {exc}", ErrorClass.INVALID_RECIPIENT)
    if isinstance(exc, httpx.RequestError):
        return transport_failure(exc, what)
    raise exc


def non_success(answer: Answer, what: str, now: Callable[[], float] = time.time) -> SendResult:
    """Classify a status that is not 2xx: 3xx/4xx permanent, 408/409/425/429/5xx transient."""
    status = answer.status
    evidence = f"{what} -> {status}"
    excerpt = answer.excerpt()
    if excerpt:
        evidence += f": {excerpt}"
    retry_after = retry_after_seconds(answer.headers.get("retry-after"), now)
    transient = {
        408: ErrorClass.HTTP_408,
        409: ErrorClass.HTTP_409,
        425: ErrorClass.HTTP_425,
        429: ErrorClass.HTTP_429,
    }
    if status in transient:
        return SendResult(
            SendOutcome.TRANSIENT, evidence, transient[status], status, retry_after_s=retry_after
        )
    if 500 <= status <= 599:
        # A 5xx may come after the receiver accepted the event: reconcile before a retry.
        return SendResult(
            SendOutcome.TRANSIENT, evidence, ErrorClass.HTTP_5XX, status, retry_after_s=retry_after
        )
    if 400 <= status <= 499:
        return SendResult(SendOutcome.REJECTED, evidence, ErrorClass.HTTP_4XX, status)
    if 300 <= status <= 399:
        return SendResult(SendOutcome.REJECTED, evidence, ErrorClass.HTTP_3XX, status)
    return SendResult(SendOutcome.UNKNOWN, evidence, ErrorClass.PROTOCOL_ERROR, status)


def string_field(body: dict[str, JsonValue] | None, name: str) -> str | None:
    """A non-empty string field of a JSON object, capped for evidence; else None."""
    if body is None:
        return None
    value = body.get(name)
    return value[:500] if isinstance(value, str) and value else None


PROCESSING = LookupStatus.PROCESSING.value
STUCK = LookupStatus.STUCK.value


async def lookup_request(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    params: dict[str, str] | None = None,
    *,
    deadline_s: float,
    delivered: Callable[[str | None], bool] = lambda _status: True,
    failed: Callable[[str | None], bool] = lambda _status: False,
    reason_field: str | None = None,
) -> LookupResult:
    """GET a lookup URL under the hard deadline, per the lookup contract (README):

    200 ``{status, id}`` found (``delivered`` / ``failed`` judge the status), 202 or status
    ``processing`` received and still processing, status ``stuck`` (409) received but its
    handler died and will not run again (an operator's), 404 not found, anything else an
    error.
    ``reason_field`` names a field of the answer whose text (the provider's reason for a
    bounce, say) goes into the evidence.
    """
    what = f"GET {url}"
    try:
        answer = await request(
            client, "GET", url, deadline_s=deadline_s, headers=headers, params=params
        )
    except (httpx.RequestError, httpx.InvalidURL, DeadlineExceeded) as exc:
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what}: {type(exc).__name__}: {exc}"[:1000]
        )
    if answer.status == 404:
        return LookupResult(LookupOutcome.NOT_FOUND, f"{what} -> 404")
    body = answer.json_object()
    status = string_field(body, "status")
    if status == STUCK and answer.status in (200, 202, 409):
        return LookupResult(
            LookupOutcome.STUCK,
            f"{what} -> {answer.status}: received, but the receiver's handler died "
            "mid-processing and will not run again; an operator settles it",
        )
    if answer.status == 202 or (answer.status == 200 and status == PROCESSING):
        return LookupResult(
            LookupOutcome.PROCESSING, f"{what} -> {answer.status}: received, still processing"
        )
    if answer.status != 200:
        shown_body = answer.excerpt()
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what} -> {answer.status}: {shown_body}"[:1000]
        )
    if body is None:
        return LookupResult(
            LookupOutcome.LOOKUP_ERROR, f"{what} -> 200 without a JSON object: {answer.excerpt()}"
        )
    message_id = string_field(body, "id")
    evidence = f"{what} -> 200, id {message_id}, status {status}"
    reason = string_field(body, reason_field) if reason_field is not None else None
    if reason is not None:
        evidence = f"{evidence}, reason {excerpt(reason.encode(), 200)}"[:1000]
    if failed(status):
        return LookupResult(LookupOutcome.FAILED, evidence, message_id, status)
    return LookupResult(
        LookupOutcome.FOUND,
        evidence,
        provider_message_id=message_id,
        provider_status=status,
        delivered=delivered(status),
    )
