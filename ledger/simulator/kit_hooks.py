"""The simulator's webhook receivers as receiver-kit apps: the kit verifies, dedupes on
webhook-id, refuses stale fencing tokens and answers lookups; the simulator's faults stay
in front of it and its recorder counts the raw requests and every run of the handler.

The kit's records live in a SQLite file the simulator owns (a temporary directory,
removed on stop); a reset starts a fresh one.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from events.contract import LookupStatus
from ledger.simulator.records import Recorder
from receiver.kit import ReceivedWebhook, Reply, WebhookReceiver, lookup_reply
from receiver.sqlite import SqliteStore

# What a kit answer means, in the recorder's words (the result of a logged request).
_SEND_RESULTS = {200: "accepted", 400: "invalid", 401: "unauthorized", 500: "handler_failed"}
_LOOKUP_RESULTS = {200: "found", 202: "processing", 404: "not_found"}


def send_result(reply: Reply) -> str:
    """The recorder's result for the kit's answer to a POST."""
    if reply.status == 200 and reply.body.get("duplicate"):
        return "duplicate"
    if reply.status == 409:
        status = reply.body.get("status")
        if status in (LookupStatus.PROCESSING, LookupStatus.STUCK):
            return str(status)
        return "stale"
    return _SEND_RESULTS.get(reply.status, f"status_{reply.status}")


def lookup_result(reply: Reply) -> str:
    """The recorder's result for the kit's answer to a lookup."""
    if reply.body.get("status") == LookupStatus.STUCK:
        return "stuck"
    return _LOOKUP_RESULTS.get(reply.status, f"status_{reply.status}")


class KitHooks:
    """One kit per (secret, tolerance) over one shared store; the handler is counted."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._dir: Path | None = None
        self._store: SqliteStore | None = None
        self._kits: dict[tuple[str, float], WebhookReceiver] = {}

    async def start(self) -> None:
        """Open a fresh store in a new temporary directory."""
        self._dir = Path(tempfile.mkdtemp(prefix="simulator-kit-"))
        self._store = SqliteStore(self._dir / "receiver.sqlite3")
        await self._store.start()

    async def stop(self) -> None:
        """Close the store and remove its directory."""
        self._kits.clear()
        if self._store is not None:
            await self._store.close()
            self._store = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def reset(self) -> None:
        """Forget every key: a new, empty store."""
        await self.stop()
        await self.start()

    def _kit(self, secret: str, tolerance_s: float) -> WebhookReceiver:
        if self._store is None:
            raise RuntimeError("the simulator's receiver kit is not started")
        kit = self._kits.get((secret, tolerance_s))
        if kit is None:
            kit = WebhookReceiver(
                self._handle, secrets=[secret], store=self._store, tolerance_s=tolerance_s
            )
            self._kits[(secret, tolerance_s)] = kit
        return kit

    def _handle(self, webhook: ReceivedWebhook) -> str:
        """The user's handler: every run is one acceptance in the recorder."""
        event, _ = self._recorder.accept(
            webhook.webhook_id,
            "webhook",
            f"/hooks/{webhook.route}",
            webhook.payload,
            dedupe=False,  # the kit dedupes; a second run here is a second processing
            id_prefix="evt",
        )
        return event.receiver_id

    async def receive(
        self,
        secret: str,
        tolerance_s: float,
        headers: Mapping[str, str],
        body: bytes,
        route: str,
    ) -> Reply:
        """The kit's answer to one POST /hooks/{route}."""
        reply = await self._kit(secret, tolerance_s).receive(headers, body, route)
        if send_result(reply) == "duplicate":
            self._recorder.repeated(headers["webhook-id"], body)
        return reply

    async def lookup(self, key: str) -> Reply:
        """The kit's lookup answer (the contract: 200 done, 202 processing, 404)."""
        if self._store is None:
            raise RuntimeError("the simulator's receiver kit is not started")
        return await lookup_reply(self._store, key)
