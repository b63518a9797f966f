"""The TypeScript client and receiver kit (typescript/), tested by Node's test runner
against the real thing: a broker, a ``ledger worker``, ``ledger api`` with a live
projection, and a PostgreSQL store for the kit. ``tsc --noEmit`` (strict) first.

The Node tests (typescript/tests/src): the shared payload hash vectors; the kit's
refusals (bad signature, stale or unsigned fencing token, unsigned lookup); runs published
by the client delivered exactly once to the kit (counted at the HTTP level and in the
handler); and a failure-matrix row, the answer timing out after the kit recorded the
request, which the worker settles by the kit's lookup. This test then checks the ledger's
own events for that row: UNKNOWN (timeout after write), found by lookup, never resent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from config.settings import Settings, WebhookEndpoint, changed
from events.delivery_state import Status
from events.outcomes import LookupOutcome
from tests.fixtures.api import ApiFactory, new_key
from tests.fixtures.postgres import DsnFactory
from tests.fixtures.projection import LiveProjection
from tests.fixtures.receiver import signing_secret
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.typescript.node import free_port, npm

pytestmark = pytest.mark.xdist_group("typescript")


def test_typescript_type_checks_strict() -> None:
    npm(["run", "typecheck"])


async def test_node_tests_against_the_worker_the_api_and_postgres(
    worker_factory: WorkerFactory,
    live_projection: LiveProjection,
    api_factory: ApiFactory,
    postgres_factory: DsnFactory,
    ledger_view: LedgerView,
    tmp_path: Path,
) -> None:
    port = free_port()
    kit = f"http://127.0.0.1:{port}"
    base: Settings = worker_factory.settings
    endpoints = dict(base.channels.webhook_endpoints)
    endpoints[f"{kit}/hooks/"] = WebhookEndpoint(lookup_url=f"{kit}/hooks/lookup")
    settings = changed(base, {"channels.webhook_endpoints": endpoints})
    worker_factory.settings = live_projection.settings = settings
    _, token = await new_key(settings, "agent-ts")
    api = api_factory.start(settings, {"projection.dsn": live_projection.dsn})
    worker_factory.start("w1")
    live_projection.start()

    results = tmp_path / "results.json"
    env = {
        "LEDGER_API_URL": api.url,
        "LEDGER_API_KEY": token,
        "LEDGER_WEBHOOK_SECRET": signing_secret() or "",
        "LEDGER_TS_RECEIVER_PORT": str(port),
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
