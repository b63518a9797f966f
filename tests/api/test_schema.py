"""Schemathesis against the live API: generated requests (valid and invalid, with and
without the key) for every operation of its own ``/openapi.json``; no 5xx, and every
answer as the schema says (status, content type, headers, body)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from config.settings import Settings
from events.ports import listening_socket
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.projection import LiveProjection

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


async def test_the_apis_connections_answer_without_waiting_for_the_clients_ack() -> None:
    """Keep-alive answers are not held back: the connections the API's socket accepts have
    TCP_NODELAY (uvicorn serves on it through asyncio, as here). Without it each answer
    waited out the client's delayed ACK, 40 ms or more (bench/http_ingest.py: 123 runs/s
    over HTTP before, 274 after)."""
    nodelay: list[int] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        nodelay.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    sock = listening_socket("127.0.0.1", 0)
    server = await asyncio.start_server(accepted, sock=sock)
    try:
        host, port = sock.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        for _ in range(100):
            if nodelay:
                break
            await asyncio.sleep(0.05)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert nodelay, "no connection accepted"
    assert nodelay[0] != 0, nodelay


async def test_the_openapi_is_3_1_and_generated_from_the_models(
    settings: Settings, api_factory: ApiFactory
) -> None:
    api = api_factory.start(settings)
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
        schema = (await http.get("/openapi.json")).json()
    assert schema["openapi"].startswith("3.1")
    assert set(schema["paths"]) == {
        "/v1/runs/{run_id}/complete",
        "/v1/runs/{run_id}/start",
        "/v1/runs/{run_id}/fail",
        "/v1/runs/{run_id}/unknown",
        "/v1/runs/{run_id}",
        "/v1/deliveries/{key}",
    }
    # The SDK's own DeliverySpec is the request's delivery.
    assert "DeliverySpec" in schema["components"]["schemas"]


async def test_schemathesis_finds_no_5xx_and_no_answer_off_the_schema(
    settings: Settings, api_factory: ApiFactory, tmp_path: Path
) -> None:
    """Every check but one: ``positive_data_acceptance`` wants a 2xx for any request the
    schema allows, but no schema says which recipients a channel takes or which
    addresses the guard refuses; those are a 422 naming the field, which the other
    checks hold to the schema."""
    _, token = await new_key(settings, "agent-fuzz")
    projection = LiveProjection(
        settings, f"sqlite://{tmp_path / 'live.sqlite3'}", tmp_path / "project.log"
    )
    projection.start()
    try:
        await _fuzz(settings, api_factory, projection, token, tmp_path)
    finally:
        projection.stop()


async def _fuzz(
    settings: Settings,
    api_factory: ApiFactory,
    projection: LiveProjection,
    token: str,
    tmp_path: Path,
) -> None:
    api = api_factory.start(
        settings,
        {
            "api.rate_per_key_s": 10_000.0,
            "api.burst_per_key": 10_000,
            "projection.dsn": projection.dsn,
        },
    )
    done = subprocess.run(
        [
            str(SCHEMATHESIS),
            "run",
            f"{api.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            "20",
            "--phases",
            "examples,coverage,fuzzing",
            "--request-timeout",
            "20",
            "--seed",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert api.process.poll() is None, api.output()
    assert "Traceback" not in api.output(), api.output()[-4000:]
