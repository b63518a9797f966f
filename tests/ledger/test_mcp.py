"""``ledger mcp`` driven by the ``mcp`` SDK's own client, against a real broker, a real
``ledger worker`` and a real ``ledger project`` (one stack for the module), the receiver the
simulator's webhook receiver (no dedupe).

An agent publishes through ``publish_run_result``; the receiver records the delivery and
answers past the worker's deadline, so the delivery is UNKNOWN, and ``delivery_status`` says
so (never a success); the worker's lookup by key settles it, and ``delivery_status`` then
says CONFIRMED with the receiver's id. Bad input is a one-line tool error; resolve is
refused without the operator permission. The README's client configuration starts a server
as written, and one test goes over streamable HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from config.settings import Settings, changed
from ledger.stack import settings_env
from tests.fixtures.broker import fresh_topics
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import WorkerFactory, fast_workers
from tests.readme import ROOT, readme_json_block
from tests.streams.failure_matrix.drivers import Fault, WebhookDriver

pytestmark = pytest.mark.xdist_group("mcp")
# UNKNOWN at the 1.5 s deadline, the lookup 2 s after it; the first wait also covers the
# module's worker joining its group, which took over 30 s on a loaded machine.
SETTLE_S = 90.0


@dataclass
class McpStack:
    """Topics of the module's own, the projection's file, and the environment an MCP server
    process needs to see them; with ``driver``, the receiver a worker and a projector
    (started) deliver to and project from."""

    settings: Settings
    env: dict[str, str]
    logs: Path
    driver: WebhookDriver | None = None


@pytest.fixture(scope="module")
async def mcp_topics(broker: Settings, tmp_path_factory: pytest.TempPathFactory) -> McpStack:
    """No process: what the tests that never wait for a delivery need (xdist may give
    them a process of their own, so they start nothing costly)."""
    tmp = tmp_path_factory.mktemp("mcp")
    fresh = await fresh_topics(broker, tmp / "data")
    settings = changed(fresh, {"projection.dsn": f"sqlite://{tmp / 'live.sqlite3'}"})
    return McpStack(settings, settings_env(settings), tmp)


@pytest.fixture(scope="module")
def mcp_stack(mcp_topics: McpStack) -> Iterator[McpStack]:
    """The module's one worker and projector, and the simulator's webhook receiver."""
    driver = WebhookDriver("plain")
    try:
        settings = driver.point(fast_workers(mcp_topics.settings))
        assert settings.projection.dsn is not None
        workers = WorkerFactory(settings, mcp_topics.logs)
        projection = LiveProjection(
            settings, settings.projection.dsn, mcp_topics.logs / "project.log"
        )
        workers.start("w1")
        projection.start()
        try:
            yield McpStack(settings, settings_env(settings), mcp_topics.logs, driver)
        finally:
            workers.stop_all()
            projection.stop()
    finally:
        driver.stop()


@asynccontextmanager
async def stdio_session(
    stack: McpStack,
    args: list[str],
    command: str = sys.executable,
    env: dict[str, str] | None = None,
) -> AsyncIterator[ClientSession]:
    """A ``ledger mcp`` process over stdio (the SDK's client starts it), initialised."""
    params = StdioServerParameters(command=command, args=args, env=env or stack.env, cwd=str(ROOT))
    with open(stack.logs / "mcp-stdio.log", "a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def call(session: ClientSession, name: str, **arguments: Any) -> types.CallToolResult:
    return await session.call_tool(name, arguments)


def text(result: types.CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


def one_line_error(result: types.CallToolResult) -> str:
    assert result.is_error, text(result)
    line = text(result)
    assert "\n" not in line
    assert "Traceback" not in line
    return line


async def status_until(
    session: ClientSession, key: str, wanted: str, seen: list[str]
) -> types.CallToolResult:
    """``delivery_status`` by key, asked until the delivery is ``wanted`` (bounded)."""
    deadline = time.monotonic() + SETTLE_S
    for _ in range(int(SETTLE_S / 0.2) + 1):
        result = await call(session, "delivery_status", idempotency_key=key)
        if not result.is_error:
            [delivery] = result.structured_content["deliveries"]
            seen.append(delivery["status"])
            if delivery["status"] == wanted:
                return result
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    raise AssertionError(f"delivery {key[:12]} never {wanted}: {seen}")


async def test_an_agent_publishes_and_learns_unknown_then_confirmed(mcp_stack: McpStack) -> None:
    driver = mcp_stack.driver
    assert driver is not None
    spec = driver.spec("mcp-run-1")
    key = driver.key("mcp-run-1", spec)
    driver.inject(key, Fault.TIMEOUT_AFTER_ACCEPT)  # recorded, answered past the deadline
    delivery = spec.model_dump(mode="json")
    async with stdio_session(mcp_stack, ["-m", "ledger", "mcp", "--agent", "agent-mcp"]) as mcp:
        listed = {tool.name for tool in (await mcp.list_tools()).tools}
        assert listed == {
            "publish_run_result",
            "delivery_status",
            "list_unknown",
            "explain_delivery",
        }

        published = await call(
            mcp,
            "publish_run_result",
            run_id="mcp-run-1",
            result_hash="sha256:mcp",
            deliveries=[delivery],
        )
        assert not published.is_error, text(published)
        assert [d["idempotency_key"] for d in published.structured_content["deliveries"]] == [key]
        assert published.structured_content["replayed"] is False
        again = await call(
            mcp,
            "publish_run_result",
            run_id="mcp-run-1",
            result_hash="sha256:mcp",
            deliveries=[delivery],
        )
        assert again.structured_content["replayed"] is True
        assert (
            again.structured_content["accepted_at"] == published.structured_content["accepted_at"]
        )
        other = await call(
            mcp,
            "publish_run_result",
            run_id="mcp-run-1",
            result_hash="sha256:other",
            deliveries=[delivery],
        )
        assert "different result_hash" in one_line_error(other)

        seen: list[str] = []
        unknown = await status_until(mcp, key, "UNKNOWN", seen)
        words = text(unknown)
        assert "UNKNOWN" in words
        assert "not a success" in words
        assert "did it leave? unknown (awaiting reconciliation)" in words
        assert "did execution finish? finished: succeeded" in words
        assert f"key at the receiver: {key}" in words
        assert unknown.structured_content["deliveries"][0]["provider_message_id"] is None
        listed_unknown = await call(mcp, "list_unknown")
        assert key in [
            d["idempotency_key"] for d in listed_unknown.structured_content["deliveries"]
        ]

        confirmed = await status_until(mcp, key, "CONFIRMED", seen)
        assert "UNKNOWN" in seen, seen  # never CONFIRMED before the lookup settled it
        accepted = driver.receiver.event(key)
        assert accepted is not None
        assert driver.ours(key) == 1
        [answer] = confirmed.structured_content["deliveries"]
        assert answer["provider_message_id"] == accepted.receiver_id
        assert f"receiver's id: {accepted.receiver_id}" in text(confirmed)
        by_run = await call(mcp, "delivery_status", run_id="mcp-run-1")
        assert [d["status"] for d in by_run.structured_content["deliveries"]] == ["CONFIRMED"]

        explained = text(await call(mcp, "explain_delivery", idempotency_key=key))
        steps = explained.splitlines()
        assert any("attempt 1 unknown: timeout_after_write" in s for s in steps), explained
        assert any("attempt 1 reconciled" in s for s in steps), explained
        assert any("delivery CONFIRMED" in s for s in steps), explained
        templates = await mcp.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            "ledger://runs/{run_id}/timeline"
        ]
        resource = await mcp.read_resource("ledger://runs/mcp-run-1/timeline")
        [contents] = resource.contents
        assert isinstance(contents, types.TextResourceContents)
        assert "delivery CONFIRMED" in contents.text


async def test_the_readme_configuration_serves_and_refuses_bad_input(mcp_topics: McpStack) -> None:
    """The README's client configuration as an MCP client reads it: its command (``ledger``,
    this interpreter's), its args, its env over the test's (the broker's address)."""
    [server] = json.loads(readme_json_block("mcp-client-config"))["mcpServers"].values()
    assert server["command"] == "ledger"
    # This tree's code under the installed console script, as `pip install -e .` of it.
    env = {**mcp_topics.env, **server["env"], "PYTHONPATH": str(ROOT)}
    env["LEDGER_KAFKA__BOOTSTRAP_SERVERS"] = mcp_topics.settings.kafka.bootstrap_servers
    ledger = str(Path(sys.executable).with_name("ledger"))
    async with stdio_session(mcp_topics, server["args"], command=ledger, env=env) as mcp:
        bad_key = await call(mcp, "delivery_status", idempotency_key="not-a-key")
        assert one_line_error(bad_key).startswith(
            "delivery_status: invalid arguments: idempotency_key"
        )
        neither = await call(mcp, "delivery_status")
        assert "give run_id or idempotency_key" in one_line_error(neither)
        secret = "https://user:hunter2@127.0.0.1:1/hook?token=hunter2"
        bad_publish = await call(
            mcp,
            "publish_run_result",
            run_id="mcp run",  # a space: not a run id
            result_hash="sha256:x",
            deliveries=[{"channel": "webhook", "recipient": secret}],
        )
        line = one_line_error(bad_publish)
        assert "run_id" in line
        assert "hunter2" not in line
        unknown_channel = await call(
            mcp,
            "publish_run_result",
            run_id="mcp-run-2",
            result_hash="sha256:x",
            deliveries=[{"channel": "pigeon", "recipient": secret}],
        )
        line = one_line_error(unknown_channel)
        assert "deliveries[0].channel" in line
        assert "hunter2" not in line
        missing = await call(mcp, "delivery_status", run_id="never-published")
        assert "not in the projection" in one_line_error(missing)
        refused = await call(
            mcp,
            "resolve",
            idempotency_key="0" * 64,
            operator="alice",
            outcome="delivered",
            reason="the receiver has it",
        )
        line = one_line_error(refused)
        assert line.startswith("resolve is off")
        assert "--operator" in line
        assert one_line_error(await call(mcp, "redrive")).startswith("redrive is off")
        assert "no tool named" in one_line_error(await call(mcp, "send_anyway"))


async def test_streamable_http_with_an_operator(mcp_topics: McpStack) -> None:
    """``--http``: the SDK's streamable-HTTP client; resolve is listed and checks who acts."""
    log = mcp_topics.logs / "mcp-http.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ledger", "mcp", "--http", "--operator", "alice"],
            env=mcp_topics.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        found = None
        for _ in range(300):  # bounded: 60 s for the server to say where it listens
            found = re.search(r"mcp on (http://127\.0\.0\.1:(\d+)/mcp)", log.read_text())
            if found is not None or process.poll() is not None:
                break
            await asyncio.sleep(0.2)
        assert found is not None, log.read_text()
        assert not 32768 <= int(found.group(2)) <= 60999
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            streamable_http_client(found.group(1), http_client=http) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            names = {tool.name for tool in (await mcp.list_tools()).tools}
            assert {"resolve", "redrive", "publish_run_result"} <= names
            stranger = await call(
                mcp,
                "resolve",
                idempotency_key="0" * 64,
                operator="mallory",
                outcome="abandoned",
                reason="why not",
            )
            assert "operator 'mallory' may not resolve" in one_line_error(stranger)
            nothing = await call(
                mcp,
                "resolve",
                idempotency_key="0" * 64,
                operator="alice",
                outcome="abandoned",
                reason="nobody will find out",
            )
            assert "in the projection" in one_line_error(nothing)  # none, or not that key
            published = await call(
                mcp,
                "publish_run_result",
                run_id="mcp-http-run",
                result_hash="sha256:http",
                deliveries=[{"channel": "webhook", "recipient": "https://example.test/hook"}],
            )
            assert not published.is_error, text(published)
            assert published.structured_content["agent"] == "mcp-agent"
            [delivery] = published.structured_content["deliveries"]
            assert delivery["idempotency_key"] in text(published)
    finally:
        process.terminate()
        process.wait(timeout=30)
