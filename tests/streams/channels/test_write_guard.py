"""The lease rule's last check and the hard total deadline, against real sockets on 127.0.0.1.

Each test watches what reached the server: a refused send must not have written a byte,
a trickled answer must not hold the request past the deadline.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from config.settings import Settings, changed
from events.outcomes import ErrorClass
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.webhook import WebhookChannel
from streams.channels.write_guard import WriteGuard
from tests.streams.channels.support import outbound, read_request

DEADLINE = Settings(
    channels={
        "http_timeout_s": 1.0,
        "http_connect_timeout_s": 0.5,
        "send_deadline_s": 1.0,
        "allowed_networks": ["127.0.0.0/8"],
    }
)
Raw = Callable[[Callable[[socket.socket], None]], str]


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until ``condition`` holds."""
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with create_http_client(DEADLINE.channels) as http:
        yield http


async def test_a_refusing_guard_writes_nothing(raw_server: Raw, client: httpx.AsyncClient) -> None:
    seen: list[bytes] = []

    def record(conn: socket.socket) -> None:
        seen.append(read_request(conn))

    base = raw_server(record)
    guard = WriteGuard(check=lambda: "the lease has 0.5s left")
    result = await WebhookChannel(client, DEADLINE.channels).send(outbound(f"{base}/hook"), guard)
    assert result.outcome is SendOutcome.NOT_SENT
    assert result.error_class is ErrorClass.FENCED
    assert "the lease has 0.5s left" in result.evidence
    assert guard.refused
    assert not guard.written
    await until(lambda: bool(seen))  # the connection opened and closed...
    assert seen == [b""]  # ...without one byte of a request


async def test_an_allowing_guard_sends_the_fencing_token(
    raw_server: Raw, client: httpx.AsyncClient
) -> None:
    seen: list[bytes] = []

    def answer(conn: socket.socket) -> None:
        seen.append(read_request(conn))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    base = raw_server(answer)
    checks: list[int] = []

    def check() -> None:
        checks.append(1)

    guard = WriteGuard(check=check)
    delivery = outbound(f"{base}/hook")
    result = await WebhookChannel(client, DEADLINE.channels).send(delivery, guard)
    assert result.outcome is SendOutcome.CONFIRMED
    assert checks == [1]
    assert guard.written
    assert f"fencing-token: {delivery.fencing_token}" in seen[0].decode().lower()


async def test_a_trickled_body_is_cut_at_the_deadline_and_the_status_stands(
    raw_server: Raw, client: httpx.AsyncClient
) -> None:
    def trickle(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{")
        for _ in range(30):  # 30 bytes over ~6 s: far past the 1 s deadline
            try:
                conn.sendall(b" ")
            except OSError:
                return
            time.sleep(0.2)

    base = raw_server(trickle)
    began = time.monotonic()
    result = await WebhookChannel(client, DEADLINE.channels).send(outbound(f"{base}/hook"))
    took = time.monotonic() - began
    assert result.outcome is SendOutcome.CONFIRMED  # the 200 arrived: accepted
    assert "deadline" in result.evidence
    assert took < DEADLINE.channels.send_deadline_s + 0.5, f"held {took:.1f}s past a 1s deadline"


async def test_no_status_within_the_deadline_after_writing_is_unknown(
    raw_server: Raw, client: httpx.AsyncClient
) -> None:
    def headers_never_complete(conn: socket.socket) -> None:
        read_request(conn)
        for _ in range(20):  # a byte at a time, never a full status line: defeats read timeouts
            try:
                conn.sendall(b"H")
            except OSError:
                return
            time.sleep(0.2)

    base = raw_server(headers_never_complete)
    began = time.monotonic()
    result = await WebhookChannel(client, DEADLINE.channels).send(outbound(f"{base}/hook"))
    assert time.monotonic() - began < DEADLINE.channels.send_deadline_s + 0.5
    assert result.outcome is SendOutcome.UNKNOWN
    assert result.error_class is ErrorClass.TIMEOUT_AFTER_WRITE


async def test_the_deadline_before_any_write_is_not_sent(raw_server: Raw) -> None:
    # One pooled connection, held by a request that never gets its answer: the second
    # request waits for the pool past its deadline, having written nothing.
    # The pool's own timeouts are long (5 s): the 1 s deadline is what ends the wait.
    one = changed(
        DEADLINE,
        {
            "channels.send_concurrency": 1,
            "channels.http_timeout_s": 5.0,
            "channels.send_deadline_s": 5.0,
        },
    )
    seen: list[bytes] = []

    def hold(conn: socket.socket) -> None:
        seen.append(read_request(conn))
        time.sleep(2.5)

    base = raw_server(hold)
    async with create_http_client(one.channels) as pool_of_one:
        channel = WebhookChannel(pool_of_one, DEADLINE.channels)
        patient = WebhookChannel(pool_of_one, one.channels)
        first = asyncio.ensure_future(patient.send(outbound(f"{base}/hook")))
        await until(lambda: bool(seen))
        second = await channel.send(outbound(f"{base}/hook"))
        assert second.outcome is SendOutcome.NOT_SENT
        assert second.error_class is ErrorClass.DEADLINE_BEFORE_WRITE
        assert (await first).outcome is SendOutcome.UNKNOWN
    assert len(seen) == 1
