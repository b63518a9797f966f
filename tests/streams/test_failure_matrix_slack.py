"""The failure-matrix rows that apply to Slack, against the fake Slack Web API.

Real broker, real ``ledger worker`` processes (a crash is a real SIGKILL at an exact fault
point), the fake Slack, which does NOT dedupe: a second post is a second message in the
conversation's history. Every row checks the ledger's final state AND that history:
exactly one message per idempotency key (none for a refused one).
"""

from __future__ import annotations

import asyncio
import signal

from slack_sdk.web.async_client import AsyncWebClient

from clients import DeliverySpec
from config.settings import Settings
from events.delivery_state import Status
from ledger.simulator.slack import BOT_ID
from streams.channels.slack import METADATA_EVENT_TYPE
from tests.fixtures.projection import LiveProjection
from tests.fixtures.slack import CHANNEL, OTHER_APP, OTHER_TOKEN, BackgroundFakeSlack
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import publish, until


def use_slack(
    factory: WorkerFactory, fake: BackgroundFakeSlack, projection: LiveProjection
) -> Settings:
    """Point the workers at the fake Slack and start the live projection beside them."""
    factory.settings = fake.settings(factory.settings)
    projection.settings = factory.settings
    projection.start()
    return factory.settings


async def publish_one(settings: Settings, fake: BackgroundFakeSlack, run_id: str) -> str:
    spec = DeliverySpec(
        channel="slack", recipient=fake.recipient(), payload={"text": f"{run_id} is ready"}
    )
    [key] = await publish(settings, run_id, [spec])
    return key


def posts(fake: BackgroundFakeSlack, key: str) -> int:
    """chat.postMessage calls that carried ``key`` (answered or not)."""
    return len(fake.fake.calls("chat.postMessage", key))


def posted_once(fake: BackgroundFakeSlack, key: str) -> str:
    """Exactly one message our bot posted in the conversation carries ``key``; its
    provider id. (Another app's message with the key is not a delivery of ours.)"""
    messages = fake.fake.messages(key, bot_id=BOT_ID)
    assert len(messages) == 1, [m.ts for m in messages]
    history = fake.fake.history("acme", CHANNEL)
    assert [(m.key, m.bot_id) for m in history].count((key, BOT_ID)) == 1
    return f"{CHANNEL}/{messages[0].ts}"


async def test_slack_timeout_after_post_is_unknown_then_confirmed_by_lookup(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s3")
    fake_slack.fake.fault("timeout_after_post", key=key, delay_s=4.0)  # posted, answered late
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED by lookup")
    state = states[key]
    assert state.attempt == 1, "an UNKNOWN must never be retried when the lookup finds it"
    assert state.last_error_class == "timeout_after_write"
    assert "lookup by idempotency key" in (state.last_reason or "")
    assert state.provider_message_id == posted_once(fake_slack, key)
    assert posts(fake_slack, key) == 1
    assert fake_slack.fake.calls("conversations.history")
    await live_projection.matches(await ledger_view())


async def test_slack_500_after_post_is_looked_up_not_resent(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s7")
    fake_slack.fake.fault("error_after_post", key=key, status=500)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED")
    assert states[key].attempt == 1
    assert states[key].last_error_class == "http_5xx"
    assert states[key].provider_message_id == posted_once(fake_slack, key)
    assert posts(fake_slack, key) == 1
    await live_projection.matches(await ledger_view())


async def test_slack_ratelimited_is_retried_after_retry_after(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s4b")
    fake_slack.fake.fault("ratelimited", key=key, retry_after=2)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after 429")
    assert states[key].attempt == 2
    posted_once(fake_slack, key)
    calls = fake_slack.fake.calls("chat.postMessage", key)
    assert [c.status for c in calls] == [429, 200]
    assert calls[1].at - calls[0].at >= 1.9  # Retry-After: 2 honoured
    await live_projection.matches(await ledger_view())


async def test_slack_channel_not_found_fails_and_posts_nothing(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s4")
    fake_slack.fake.fault("error", key=key, error="channel_not_found")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED")
    assert states[key].last_error_class == "provider_rejected"
    assert "channel_not_found" in (states[key].last_reason or "")
    assert fake_slack.fake.messages(key) == []
    assert posts(fake_slack, key) == 1, "a permanent rejection is never retried"
    await live_projection.matches(await ledger_view())


async def test_slack_worker_killed_after_the_post_is_settled_by_lookup(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s5")
    doomed = worker_factory.start("w1", faults=("worker.after_response",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert len(fake_slack.fake.messages(key)) == 1  # Slack had it when the worker died
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after crash")
    assert states[key].provider_message_id == posted_once(fake_slack, key)
    assert posts(fake_slack, key) == 1, "nothing may be posted twice after the crash"
    await live_projection.matches(await ledger_view())


async def test_slack_another_apps_message_with_the_key_does_not_confirm_it(
    worker_factory: WorkerFactory,
    fake_slack: BackgroundFakeSlack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_slack(worker_factory, fake_slack, live_projection)
    key = await publish_one(settings, fake_slack, "run-s8")
    # Killed with the claim in the log and nothing posted: the lease expires into UNKNOWN.
    doomed = worker_factory.start("w1", faults=("worker.before_send",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert fake_slack.fake.messages(key) == []
    # Another app in the conversation posts a message carrying the key's metadata (the
    # official SDK, with its own bot token). It is not our delivery: only "not found" of
    # OUR message (twice) may let the next worker post, once.
    other = AsyncWebClient(token=OTHER_TOKEN, base_url=fake_slack.api_url)
    metadata = {"event_type": METADATA_EVENT_TYPE, "event_payload": {"idempotency_key": key}}
    forged = await other.chat_postMessage(channel=CHANNEL, text="forged", metadata=metadata)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED by our post")
    state = states[key]
    assert state.attempt >= 2, "a foreign message may not settle the UNKNOWN as delivered"
    assert state.provider_message_id == posted_once(fake_slack, key)
    assert state.provider_message_id != f"{CHANNEL}/{forged['ts']}"
    assert posts(fake_slack, key) == 2  # the other app's post and our one post
    assert [m.bot_id for m in fake_slack.fake.messages(key)] == [OTHER_APP.bot_id, BOT_ID]
    await live_projection.matches(await ledger_view())
