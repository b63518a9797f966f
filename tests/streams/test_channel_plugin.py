"""A third-party channel plugin (the README's two blocks, as written), installed from a
temporary package, found through the ``delivery_ledger.channels`` entry point and
delivered through end to end: the SDK checks its recipients, a real ``ledger worker``
builds its adapter with its settings, sends to a real HTTP receiver on 127.0.0.1 that does
not dedupe, and the delivery is CONFIRMED with exactly one request per key at the
receiver."""

from __future__ import annotations

import importlib
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import JsonValue, Secret

from clients import DeliverySpec, Publisher, PublishRejected
from config.settings import Settings, changed
from events.channels import channel_names, forget_discovered
from events.delivery_state import Status
from events.ports import free_port
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for
from tests.readme import readme_block

TOKEN = "acme-t0ken-not-for-logs"


def install_plugin(root: Path) -> None:
    """A package and its ``.dist-info`` on a path entry: what pip would leave behind."""
    package = root / "acme_channel"
    package.mkdir()
    (package / "__init__.py").write_text(readme_block("plugin-light-half"))
    (package / "adapter.py").write_text(readme_block("plugin-adapter"))
    info = root / "acme_channel-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-channel\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[delivery_ledger.channels]\nacme = acme_channel:plugin\n"
    )


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin installed for this process (sys.path) and its children (PYTHONPATH),
    and nothing of it left afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    install_plugin(root)
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    forget_discovered()
    paths = [str(root), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] == "acme_channel"]:
            del sys.modules[name]
        importlib.invalidate_caches()
        forget_discovered()


class Inbox:
    """A receiver that does NOT dedupe: every request is counted, per key."""

    def __init__(self) -> None:
        self.keys: Counter[str] = Counter()
        self.bad_auth = 0

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            self.bad_auth += 1
            return web.json_response({"error": "unauthorized"}, status=401)
        key = request.headers.get("x-acme-key", "")
        await request.read()
        self.keys[key] += 1
        return web.json_response({"id": f"acme-{key[:8]}-{self.keys[key]}"})


async def test_a_plugin_from_an_entry_point_delivers_once_per_key(
    acme: Path, worker_factory: WorkerFactory, ledger_view: LedgerView
) -> None:
    assert "acme" in channel_names()
    inbox = Inbox()
    app = web.Application()
    app.router.add_post("/{inbox}", inbox.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        config = Secret[dict[str, JsonValue]]({"token": TOKEN})
        settings: Settings = changed(
            worker_factory.settings, {"channels.settings": {"acme": config}}
        )
        worker_factory.settings = settings

        # The channel checks its recipients at publish time: one line naming what is wrong.
        with pytest.raises(PublishRejected, match=r"^recipient: acme recipient must be acme://"):
            DeliverySpec.parse("acme:https://127.0.0.1/x", {})

        specs = [
            DeliverySpec(channel="acme", recipient=f"acme://127.0.0.1:{port}/{box}", payload={})
            for box in ("ops", "audit")
        ]
        async with Publisher(settings, producer_name="test-agent") as publisher:
            requests = await publisher.run_succeeded("run-acme", "sha256:r", specs)
        keys = [r.idempotency_key for r in requests]

        worker = worker_factory.start("w1")

        async def confirmed() -> bool:
            assert worker.alive(), worker.output()[-3000:]
            states = await ledger_view()
            return all(k in states and states[k].status is Status.CONFIRMED for k in keys)

        await wait_for(confirmed, 60, "both acme deliveries CONFIRMED")
        assert inbox.keys == Counter(dict.fromkeys(keys, 1))
        assert inbox.bad_auth == 0
        states = await ledger_view()
        assert states[keys[0]].provider_message_id == f"acme-{keys[0][:8]}-1"
        assert TOKEN not in worker.output()
    finally:
        await runner.cleanup()
