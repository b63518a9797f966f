"""Who may ask: the Host header (DNS rebinding), bearer-token input, token rules at start."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import SecretStr

from config.settings import Settings, changed
from ledger.stack import settings_env
from projections.dashboard.guard import allowed_hosts, host_allowed
from tests.dashboard.conftest import Stack, start_stack

TOKEN = secrets.token_urlsafe(32)
DATA_PATHS = ("/", "/api/overview", "/api/runs/run-a", "/api/search?q=run", "/metrics")


async def raw_get(
    url: str, path: str, headers: list[bytes], version: str = "1.1"
) -> tuple[int, bytes]:
    """One HTTP GET with header lines sent byte for byte (no client normalises them)."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        head = [f"GET {path} HTTP/{version}".encode(), *headers, b"Connection: close", b"", b""]
        writer.write(b"\r\n".join(head))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


async def test_a_request_naming_another_host_gets_no_data(stack: Stack) -> None:
    port = urlsplit(stack.url).port
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        for host in ("attacker.example", f"attacker.example:{port}", "localhost.evil.test"):
            for path in DATA_PATHS:
                refused = await http.get(path, headers={"Host": host})
                assert refused.status_code == 421, (host, path)
                assert "run-a" not in refused.text
                assert "ledger_" not in refused.text
                assert len(refused.text) < 200
                assert refused.headers["X-Content-Type-Options"] == "nosniff"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            ok = await http.get("/api/runs/run-a", headers={"Host": host})
            assert ok.status_code == 200, host
            assert ok.json()["run_id"] == "run-a"
    # No Host at all does not name this dashboard either (HTTP/1.1 needs one: the parser
    # refuses it; HTTP/1.0 gets past the parser, not past the check).
    for version, expected in (("1.1", 400), ("1.0", 421)):
        status, body = await raw_get(stack.url, "/api/overview", [], version)
        assert status == expected, version
        assert b"run-a" not in body


async def test_a_configured_name_is_answered(settings: Settings) -> None:
    named = changed(settings, {"dashboard.allowed_hosts": ["ledger.internal.test"]})
    async for stack in start_stack(named):
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
            ok = await http.get("/api/overview", headers={"Host": "ledger.internal.test:8765"})
            assert ok.status_code == 200
            other = await http.get("/api/overview", headers={"Host": "ledger.other.test"})
            assert other.status_code == 421


async def test_any_authorization_input_is_401_never_500(settings: Settings) -> None:
    guarded = changed(settings, {"dashboard.token": SecretStr(TOKEN)})
    host = b"Host: 127.0.0.1"
    async for stack in start_stack(guarded):
        wrong: list[bytes] = [
            b"Authorization: Bearer \xc3\xa9t\xc3\xa9-" + TOKEN.encode(),  # UTF-8, non-ASCII
            b"Authorization: Bearer \xff\xfex",  # not even UTF-8
            b"Authorization: Bearer " + "\u00e9".encode("latin-1") * 40,
            b"Authorization:",
            b"Authorization: Bearer",
            b"Authorization: Bearer ",
            b"Authorization: Basic " + TOKEN.encode(),
            b"Authorization: " + TOKEN.encode(),
            b"Authorization: Bearer " + TOKEN.encode()[:-1],
            b"Authorization: Bearer " + TOKEN.encode() + b"x",
            b"Authorization: Bearer " + b"A" * 6000,  # huge, still under the parser's limit
        ]
        for path in ("/api/overview", "/metrics"):
            for header in wrong:
                status, body = await raw_get(stack.url, path, [host, header])
                assert status == 401, (path, header[:60])
                assert b"run-a" not in body
                assert TOKEN.encode() not in body
            # Beyond the 8190-byte header limit the guard answers before it reads the header.
            status, body = await raw_get(
                stack.url, path, [host, b"Authorization: Bearer " + b"A" * 20_000]
            )
            assert (status, b"run-a" in body) == (400, False)
            for scheme in (b"Bearer", b"bearer", b"BEARER"):
                header = b"Authorization: " + scheme + b"  " + TOKEN.encode() + b" "
                status, _ = await raw_get(stack.url, path, [host, header])
                assert status == 200, (path, scheme)


@pytest.mark.parametrize(
    ("bound", "extra", "host", "answered"),
    [
        ("0.0.0.0", [], "10.1.2.3:8765", True),  # every interface: any address...
        ("0.0.0.0", [], "[fd00::1]:8765", True),
        ("0.0.0.0", [], "attacker.example:8765", False),  # ...but no name by default
        ("0.0.0.0", [], "localhost:8765", False),
        ("0.0.0.0", ["Ledger.Example."], "ledger.example:443", True),
        ("::", [], "[::1]", True),
        ("::1", [], "[::1]:8765", True),
        ("::1", [], "localhost", True),
        ("::1", [], "10.1.2.3", False),  # bound to one address: only that one
        ("192.0.2.7", [], "192.0.2.7:8765", True),
        ("192.0.2.7", [], "localhost:8765", False),
        ("127.0.0.1", [], "127.0.0.1:99999", False),
        ("127.0.0.1", [], "127.0.0.1:x", False),
        ("127.0.0.1", [], "user@127.0.0.1", False),
        ("127.0.0.1", [], "", False),
    ],
)
def test_which_host_names_the_dashboard(
    settings: Settings, bound: str, extra: list[str], host: str, answered: bool
) -> None:
    given = changed(settings, {"dashboard.host": bound, "dashboard.allowed_hosts": extra})
    assert host_allowed(host, given.dashboard, allowed_hosts(given.dashboard)) is answered


def dashboard(settings: Settings, token: str) -> subprocess.CompletedProcess[str]:
    """``ledger dashboard`` with ``LEDGER_DASHBOARD__TOKEN=token`` (refused before serving,
    or stopped by the timeout: a test that would wait forever)."""
    return subprocess.run(
        [sys.executable, "-m", "ledger", "dashboard", "--port", "0"],
        env={**settings_env(settings), "LEDGER_DASHBOARD__TOKEN": token},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("change-me", "LEDGER_DASHBOARD__TOKEN is 9 bytes; it must be at least 32"),
        ("s3cret", "LEDGER_DASHBOARD__TOKEN is 6 bytes; it must be at least 32"),
        ("change-me-" + "7f3a9c1e" * 4, "LEDGER_DASHBOARD__TOKEN looks like a placeholder"),
        ("a" * 40, "LEDGER_DASHBOARD__TOKEN looks like a placeholder"),
    ],
)
def test_a_short_or_placeholder_token_is_refused_at_start(
    settings: Settings, token: str, says: str
) -> None:
    done = dashboard(settings, token)
    assert done.returncode != 0
    assert done.stderr.splitlines()[0].startswith(f"error: {says}"), done.stderr
    assert done.stderr.splitlines()[1].startswith("hint: generate one")
    assert token not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
