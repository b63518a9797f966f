"""Helpers for channel tests: outbound deliveries with fresh keys, raw HTTP reading."""

from __future__ import annotations

import socket
import uuid
from typing import Any, Literal, TypedDict

from pydantic import JsonValue

from streams.channels.base import OutboundDelivery

# What ``socket.getaddrinfo`` answers (its typeshed type), for tests standing in for it.
AddressInfo = list[
    tuple[Literal[socket.AddressFamily.AF_INET], socket.SocketKind, int, str, tuple[str, int]]
    | tuple[
        Literal[socket.AddressFamily.AF_INET6],
        socket.SocketKind,
        int,
        str,
        tuple[str, int, int, int] | tuple[int, bytes],
    ]
]


class DeliveryChanges(TypedDict, total=False):
    """Fields of an ``OutboundDelivery`` a test may change with ``dataclasses.replace``
    (not its channel: that is the helper's own)."""

    idempotency_key: str
    run_id: str
    event_type: str
    recipient: str
    payload: JsonValue
    attempt: int
    provider_message_id: str | None


def outbound(
    recipient: str, channel: str = "webhook", *, key: str | None = None, payload: Any = None
) -> OutboundDelivery:
    """One attempt of a fresh logical delivery."""
    return OutboundDelivery(
        idempotency_key=key or uuid.uuid4().hex,
        run_id="run-1",
        event_type="report.ready",
        channel=channel,
        recipient=recipient,
        payload={"text": "report ready", "n": 1} if payload is None else payload,
        attempt=1,
        fencing_token=1,
    )


def read_request(conn: socket.socket) -> bytes:
    """Read one HTTP request (headers + Content-Length body) from a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
