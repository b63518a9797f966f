"""The TypeScript client and receiver kit (typescript/), tested by Node's test runner
against the real thing: a broker, a ``ledger worker``, ``ledger api`` with a live
projection, and PostgreSQL for the kit's store; ``tsc --noEmit`` (strict) on the packages
while those start.

The Node tests (typescript/tests/src): the shared payload hash vectors; the kit's
refusals (bad signature, stale or unsigned fencing token, unsigned lookup); runs published
by the client delivered exactly once to the kit (counted at the HTTP level and in the
handler); and a failure-matrix row, the answer timing out after the kit recorded the
request, which the worker settles by the kit's lookup. This test then checks the ledger's
own events for that row: UNKNOWN (timeout after write), found by lookup, never resent.
Beside them, the README's two TypeScript blocks run as written: the publishing example
publishes a run whose delivery the receiver example (its own node process) takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from config.settings import Settings, WebhookEndpoint, changed
from events.delivery_state import Status
from events.outcomes import LookupOutcome
from events.ports import free_port
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.postgres import DsnFactory
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import signing_secret
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for
from tests.readme import readme_typescript_block
from tests.typescript.node import compile_readme_blocks, node, npm, run

pytestmark = pytest.mark.xdist_group("typescript")


def _endpoint(settings: Settings, base: str) -> Settings:
    endpoints = dict(settings.channels.webhook_endpoints)
    endpoints[f"{base}/hooks/"] = WebhookEndpoint(lookup_url=f"{base}/hooks/lookup")
    return changed(settings, {"channels.webhook_endpoints": endpoints})


def _start_example(script: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The README's receiver example as a node process; waits until it answers."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [node(), str(script)],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    probe = f"http://127.0.0.1:{env['PORT']}/hooks/lookup/probe"
    for _ in range(150):
        try:
            if httpx.get(probe, timeout=1).status_code == 401:  # unsigned: the kit answers
                return process
        except httpx.TransportError:
            pass
        assert process.poll() is None, log.read_text()
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the README receiver example did not listen: {log.read_text()}")


async def test_node_tests_and_readme_examples_against_the_worker_the_api_and_postgres(
    worker_factory: WorkerFactory,
    live_projection: LiveProjection,
    api_factory: ApiFactory,
    postgres_factory: DsnFactory,
    ledger_view: LedgerView,
    tmp_path: Path,
) -> None:
    blocks = {
        "publish": readme_typescript_block("ts-publish-example"),
        "receiver": readme_typescript_block("ts-receiver-example"),
    }
    # tsc (strict) over the packages and over the README's blocks, while the servers start.
    typecheck = asyncio.create_task(asyncio.to_thread(npm, ["run", "typecheck"]))
    compiled = asyncio.create_task(
        asyncio.to_thread(compile_readme_blocks, blocks, tmp_path / "readme")
    )
    kit, example = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    settings = _endpoint(_endpoint(worker_factory.settings, kit), example)
    worker_factory.settings = live_projection.settings = settings
    _, token = await new_key(settings, "agent-ts")
    api = api_factory.start(settings, {"projection.dsn": live_projection.dsn})
    worker_factory.start("w1")
    live_projection.start()
    secret = signing_secret() or ""
    await typecheck
    examples = await compiled

    receiver_env = {
        "PORT": example.rsplit(":", 1)[1],
        "WEBHOOK_SECRETS": secret,
        "DATABASE_URL": postgres_factory(),
    }
    receiver = _start_example(examples["receiver"], receiver_env, tmp_path / "ex.log")
    try:
        published = await asyncio.to_thread(
            run,
            [node(), str(examples["publish"])],
            tmp_path,
            {"LEDGER_API_URL": api.url, "LEDGER_API_KEY": token, "HOOK_URL": f"{example}/hooks/t"},
            60,
        )
        first, second = published.split("\n")[:2]
        example_key, same_hash = first.split(" ")
        assert (same_hash, second) == ("true", "true"), published

        results = tmp_path / "results.json"
        env = {
            "LEDGER_API_URL": api.url,
            "LEDGER_API_KEY": token,
            "LEDGER_WEBHOOK_SECRET": secret,
            "LEDGER_TS_RECEIVER_PORT": kit.rsplit(":", 1)[1],
            "LEDGER_TS_STORE_DSN": postgres_factory(),
            "LEDGER_TS_RESULTS": str(results),
            "LEDGER_TS_RUN_SUFFIX": uuid.uuid4().hex[:8],
        }
        output = await asyncio.to_thread(npm, ["test"], env, 150)
        assert "# fail 0" in output, output[-4000:]
        assert "# skipped 0" in output, output[-4000:]

        found = json.loads(results.read_text())
        states = await ledger_view()
        slow = states[found["slowKey"]]
        assert slow.status is Status.CONFIRMED
        assert slow.attempt == 1, "the lookup found it: never sent again"
        assert slow.last_error_class == "timeout_after_write"  # UNKNOWN first
        assert slow.reconciled is LookupOutcome.FOUND
        assert slow.provider_message_id
        assert slow.provider_message_id.startswith("ts-3-")
        for key in found["keys"]:
            assert states[key].status is Status.CONFIRMED
            assert states[key].attempt == 1

        async def example_confirmed() -> bool:
            state = (await ledger_view()).get(example_key)
            return state is not None and state.status is Status.CONFIRMED

        await wait_for(example_confirmed, 30, "the README example's delivery CONFIRMED")
        state = (await ledger_view())[example_key]
        assert state.provider_message_id == f"ticket-{example_key[:12]}"
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
