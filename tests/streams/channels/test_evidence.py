"""Evidence keeps a response's status and a short, sanitized excerpt of its body, never
the body itself: it is kept forever and shown to operators."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import SecretStr

from config.settings import Settings
from events.ports import free_port
from streams.channels.base import SendOutcome
from streams.channels.excerpt import EXCERPT_CHARS, REDACTED, excerpt
from streams.channels.http import create_http_client
from streams.channels.webhook import WebhookChannel
from tests.streams.channels.support import outbound

ADMIN_TOKEN = "adm_9f8e7d6c5b4a39281706f5e4d3c2b1a0"
INTERNAL_403 = (
    "<html><body><h1>403 Forbidden</h1>\n<p>internal admin console: use\r\n"
    f"Authorization: Bearer {ADMIN_TOKEN}</p>\x1b[31m"
    f'<script>var cfg = {{"api_key": "{ADMIN_TOKEN}", "db_password": "hunter2hunter2"}}</script>'
    + " padding" * 200
    + "</body></html>"
).encode()


class _Internal(BaseHTTPRequestHandler):
    """An internal service that answers every POST with a 403 page carrying its token."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(403)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(INTERNAL_403)))
        self.end_headers()
        self.wfile.write(INTERNAL_403)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def internal() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Internal)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/admin"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_403_body_with_a_token_leaves_only_the_status_and_a_redacted_excerpt(
    internal: str,
) -> None:
    settings = Settings(
        channels={
            "allowed_networks": ["127.0.0.0/8"],
            "webhook_secret": SecretStr("whsec_dGVzdC1ldmlkZW5jZS1zZWNyZXQtMjRi"),
        }
    )
    async with create_http_client(settings.channels) as client:
        result = await WebhookChannel(client, settings.channels).send(outbound(internal))
    assert result.outcome is SendOutcome.REJECTED
    assert result.http_status == 403
    assert "-> 403" in result.evidence
    assert "403 Forbidden" in result.evidence  # what the page said, briefly
    assert ADMIN_TOKEN not in result.evidence
    assert "hunter2" not in result.evidence
    assert "\x1b" not in result.evidence
    assert "\n" not in result.evidence
    assert len(result.evidence) < len(internal) + 20 + EXCERPT_CHARS


@pytest.mark.parametrize(
    ("body", "kept", "gone"),
    [
        (b'{"error": "forbidden", "token": "tok_live_abc123"}', "forbidden", "tok_live_abc123"),
        (b"password=s3cr3t&user=bob", "user=bob", "s3cr3t"),
        (b"WWW-Authenticate failed; Authorization: Basic YWRtaW46czNjcjN0", "failed", "YWRtaW46"),
        (b"key AKIAIOSFODNN7EXAMPLE1 leaked", "leaked", "AKIAIOSFODNN7EXAMPLE1"),
        (b"session_id: 0123456789abcdef", "session_id", "0123456789abcdef"),
    ],
)
def test_excerpt_redacts_credential_looking_values(body: bytes, kept: str, gone: str) -> None:
    text = excerpt(body)
    assert kept in text
    assert gone not in text
    assert REDACTED in text


def test_excerpt_is_one_short_printable_line() -> None:
    text = excerpt(b"line one\r\nline\ttwo\x00\x07 " + b"x " * 500)
    assert text.startswith("line one line two")
    assert len(text) <= EXCERPT_CHARS
    assert text.isprintable()


def test_excerpt_keeps_ordinary_words_and_numbers() -> None:
    body = b"rate limited: try again in 30 seconds (request 123456789012345678901234)"
    assert excerpt(body) == body.decode()
