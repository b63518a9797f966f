"""Both connection pools under httpx (``LEDGER_CHANNELS__HTTP_POOL``) keep the same guarantees.

The rest of tests/streams/channels runs on whichever pool the settings pick; these run the
properties that depend on the pool's internals on both, against raw sockets on 127.0.0.1:
a refused write leaves no byte, a pooled connection the server closed is not written to,
a name that resolves to any disallowed address is never connected to, the first
(checked) address is the one connected to, and failures split into nothing written vs
maybe written the same way.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import pytest

from config.settings import Settings
from events.outcomes import ErrorClass
from events.ports import free_port
from streams.channels.base import SendOutcome
from streams.channels.http import create_http_client
from streams.channels.webhook import WebhookChannel
from streams.channels.write_guard import WriteGuard
from tests.streams.channels.support import AddressInfo, outbound, read_request

POOLS = ["aiohttp", "httpcore"]
Raw = Callable[[Callable[[socket.socket], None]], str]
OK = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n\r\n{"id":"r1"}'


def settings_for(pool: str) -> Settings:
    return Settings(
        channels={
            "http_pool": pool,
            "http_timeout_s": 1.0,
            "http_connect_timeout_s": 0.5,
            "send_deadline_s": 2.0,
            "allowed_networks": ["127.0.0.0/8"],
        }
    )


@pytest.mark.parametrize("pool", POOLS)
async def test_a_refused_write_sends_no_byte_and_closes_the_connection(
    pool: str, raw_server: Raw
) -> None:
    seen: list[bytes] = []
    base = raw_server(lambda conn: seen.append(read_request(conn)))
    settings = settings_for(pool)
    async with create_http_client(settings.channels) as client:
        guard = WriteGuard(check=lambda: "fenced")
        result = await WebhookChannel(client, settings.channels).send(outbound(f"{base}/h"), guard)
    assert (result.outcome, result.error_class) == (SendOutcome.NOT_SENT, ErrorClass.FENCED)
    assert not guard.written
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.02)
    assert seen == [b""]


@pytest.mark.parametrize("pool", POOLS)
async def test_a_pooled_connection_the_server_closed_is_not_written_to(
    pool: str, raw_server: Raw
) -> None:
    # The server answers on a keep-alive connection and then closes it; the next send must
    # go out on a fresh connection (not be written into the dead one and become UNKNOWN).
    requests: list[bytes] = []

    def answer_then_close(conn: socket.socket) -> None:
        requests.append(read_request(conn))
        conn.sendall(OK)

    base = raw_server(answer_then_close)
    settings = settings_for(pool)
    async with create_http_client(settings.channels) as client:
        channel = WebhookChannel(client, settings.channels)
        first = await channel.send(outbound(f"{base}/h"))
        # Blocking on purpose: the server's close arrives while the loop does not run, so
        # the pool still holds the connection as open and must notice before writing.
        time.sleep(0.3)
        second = await channel.send(outbound(f"{base}/h"))
    assert first.outcome is second.outcome is SendOutcome.CONFIRMED, (first, second)
    assert len(requests) == 2


@pytest.mark.parametrize("pool", POOLS)
async def test_any_disallowed_address_blocks_the_name_and_only_the_first_is_used(
    pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    listen_port = free_port()
    listener = socket.create_server(("127.0.0.1", listen_port))
    accepted: list[bool] = []

    def accept() -> None:
        listener.settimeout(3)
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            accepted.append(True)
            read_request(conn)
            conn.sendall(OK)

    threading.Thread(target=accept, daemon=True).start()
    real = socket.getaddrinfo

    def resolve(
        host: bytes | str | None,
        port: bytes | str | int | None,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> AddressInfo:
        if host == "mixed.test":  # one allowed address, one internal one
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", listen_port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", listen_port)),
            ]
        if host == "twice.test":  # two allowed addresses: only the first is connected to
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", listen_port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", listen_port)),
            ]
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    settings = settings_for(pool)
    try:
        async with create_http_client(settings.channels) as client:
            channel = WebhookChannel(client, settings.channels)
            blocked = await channel.send(outbound(f"http://mixed.test:{listen_port}/h"))
            assert (blocked.outcome, blocked.error_class) == (
                SendOutcome.REJECTED,
                ErrorClass.BLOCKED_ADDRESS,
            )
            assert "10.0.0.5" in blocked.evidence
            assert accepted == []
            sent = await channel.send(outbound(f"http://twice.test:{listen_port}/h"))
            assert sent.outcome is SendOutcome.CONFIRMED, sent
            assert accepted == [True]
    finally:
        listener.close()


@pytest.mark.parametrize("pool", POOLS)
async def test_a_reset_after_the_request_is_unknown_and_a_refused_connect_is_not_sent(
    pool: str, raw_server: Raw
) -> None:
    def reset(conn: socket.socket) -> None:
        read_request(conn)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    base = raw_server(reset)
    refused_port = free_port()  # nothing listens there
    settings = settings_for(pool)
    async with create_http_client(settings.channels) as client:
        channel = WebhookChannel(client, settings.channels)
        after = await channel.send(outbound(f"{base}/h"))
        before = await channel.send(outbound(f"http://127.0.0.1:{refused_port}/h"))
    assert (after.outcome, after.error_class) == (
        SendOutcome.UNKNOWN,
        ErrorClass.RESET_AFTER_WRITE,
    ), after
    assert (before.outcome, before.error_class) == (
        SendOutcome.NOT_SENT,
        ErrorClass.CONNECT_REFUSED,
    ), before
