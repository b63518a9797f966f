"""The failure-matrix rows that apply to the email_api channel, against the fake email API.

Real broker, real ``ledger worker`` processes, the fake email API, which does NOT dedupe
(unless a row says so): a second request is a second email in its message list. Every row
checks the ledger's final state AND that list: exactly one accepted message per
idempotency key (none for a refused one).
"""

from __future__ import annotations

from clients import DeliverySpec
from config.settings import Settings
from events.delivery_state import Status
from tests.fixtures.broker import ReadTopic, all_deliveries
from tests.fixtures.email_api import RECIPIENT, BackgroundFakeEmailApi, FakeEmailApiFactory
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import publish, until


def use_email_api(
    factory: WorkerFactory,
    fake: BackgroundFakeEmailApi,
    projection: LiveProjection,
    **channel: bool,
) -> Settings:
    """Point the workers at the fake (``channel``: email_api settings such as
    lookup_by_key) and start the live projection beside them."""
    factory.settings = fake.settings(factory.settings, **channel)
    projection.settings = factory.settings
    projection.start()
    return factory.settings


async def publish_one(settings: Settings, run_id: str) -> str:
    spec = DeliverySpec(
        channel="email_api",
        recipient=RECIPIENT,
        payload={"subject": f"{run_id} is ready", "text": "The report is ready."},
    )
    [key] = await publish(settings, run_id, [spec])
    return key


def sends(fake: BackgroundFakeEmailApi, key: str) -> list[int]:
    """The statuses of the POST /emails calls that carried ``key`` (answered or not)."""
    return [c.status for c in fake.fake.calls("POST", key)]


def accepted_once(fake: BackgroundFakeEmailApi, key: str) -> str:
    """Exactly one message in the fake's list was made by ``key``; its id."""
    messages = fake.fake.messages(key)
    assert len(messages) == 1, [m.id for m in messages]
    assert messages[0].to == [RECIPIENT]
    return messages[0].id


async def test_email_timeout_after_accept_is_unknown_found_by_key_then_delivered(
    worker_factory: WorkerFactory,
    fake_email_api_factory: FakeEmailApiFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    # Delivered from its second lookup on: the lookup by key finds it "sent", so the
    # delivery is SENT, and the poll by id finds it delivered.
    fake_email_api = fake_email_api_factory(deliver_after_reads=2)
    settings = use_email_api(worker_factory, fake_email_api, live_projection)
    key = await publish_one(settings, "run-e3")
    fake_email_api.fake.fault("timeout_after_accept", key=key, delay_s=4.0)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED")
    state = states[key]
    assert state.attempt == 1, "an UNKNOWN must never be retried when the lookup finds it"
    assert state.last_error_class == "timeout_after_write"
    assert state.provider_message_id == accepted_once(fake_email_api, key)
    assert sends(fake_email_api, key) == [200]
    events = await read_topic(settings.kafka.topic_deliveries)
    assert all_deliveries(events)
    kinds = [e.type for e in events if e.idempotency_key == key]
    # UNKNOWN, found by key (-> SENT), polled by id until delivered.
    assert kinds.index("delivery.unknown") < kinds.index("delivery.reconciled")
    reconciled = [e for e in events if e.type == "delivery.reconciled"]
    assert reconciled[0].evidence.startswith(f"GET {fake_email_api.api_url}/emails -> 200")
    assert [r.provider_status for r in reconciled] == ["sent", "delivered"]
    assert f"/emails/{state.provider_message_id} -> 200" in reconciled[-1].evidence
    assert reconciled[-1].provider_status == "delivered"
    assert any(c.path == "/emails" for c in fake_email_api.fake.calls("GET"))
    await live_projection.matches(await ledger_view())


async def test_email_500_after_accept_is_looked_up_not_resent(
    worker_factory: WorkerFactory,
    fake_email_api: BackgroundFakeEmailApi,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_email_api(worker_factory, fake_email_api, live_projection)
    key = await publish_one(settings, "run-e7")
    fake_email_api.fake.fault("error_after_accept", key=key, status=500)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED")
    assert states[key].attempt == 1
    assert states[key].last_error_class == "http_5xx"
    assert states[key].provider_message_id == accepted_once(fake_email_api, key)
    assert sends(fake_email_api, key) == [500]
    await live_projection.matches(await ledger_view())


async def test_email_429_is_retried_after_retry_after(
    worker_factory: WorkerFactory,
    fake_email_api: BackgroundFakeEmailApi,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_email_api(worker_factory, fake_email_api, live_projection)
    key = await publish_one(settings, "run-e4b")
    fake_email_api.fake.fault("ratelimited", key=key, retry_after=2)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after 429")
    assert states[key].attempt == 2
    assert states[key].provider_message_id == accepted_once(fake_email_api, key)
    calls = fake_email_api.fake.calls("POST", key)
    assert [c.status for c in calls] == [429, 200]
    assert calls[1].at - calls[0].at >= 1.9  # Retry-After: 2 honoured
    await live_projection.matches(await ledger_view())


async def test_email_422_fails_and_sends_nothing(
    worker_factory: WorkerFactory,
    fake_email_api: BackgroundFakeEmailApi,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_email_api(worker_factory, fake_email_api, live_projection)
    key = await publish_one(settings, "run-e4")
    fake_email_api.fake.fault("reject", key=key, message="`to` is on the suppression list")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED")
    assert states[key].last_error_class == "http_4xx"
    assert "validation_error: `to` is on the suppression list" in (states[key].last_reason or "")
    assert fake_email_api.fake.messages(key) == []
    assert sends(fake_email_api, key) == [422], "a permanent rejection is never retried"
    await live_projection.matches(await ledger_view())


async def test_email_bounce_fails_with_the_providers_reason(
    worker_factory: WorkerFactory,
    fake_email_api: BackgroundFakeEmailApi,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_email_api(worker_factory, fake_email_api, live_projection)
    key = await publish_one(settings, "run-e8")
    fake_email_api.fake.fault("bounce", key=key, reason="550 5.1.1 user unknown")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED by bounce")
    state = states[key]
    assert state.last_error_class == "provider_failed"
    assert "bounced" in (state.last_reason or "")
    assert "550 5.1.1 user unknown" in (state.last_reason or "")
    accepted_once(fake_email_api, key)  # it was accepted once: the bounce came later
    assert sends(fake_email_api, key) == [200]
    await live_projection.matches(await ledger_view())


async def test_email_without_lookup_retries_under_the_providers_24h_key_rule(
    worker_factory: WorkerFactory,
    fake_email_api_factory: FakeEmailApiFactory,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
    read_topic: ReadTopic,
) -> None:
    # A provider that gets by id only (no lookup by key) but honours Idempotency-Key for
    # 24 h, as declared: an UNKNOWN with no message id is retried under the rule, and the
    # provider answers the first message's id instead of sending a second email.
    fake = fake_email_api_factory(dedupe=True, lookup_by_key=False)
    settings = use_email_api(
        worker_factory, fake, live_projection, lookup_by_key=False, provider_dedupes=True
    )
    key = await publish_one(settings, "run-e7b")
    fake.fake.fault("timeout_after_accept", key=key, delay_s=4.0)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED")
    assert states[key].attempt == 2
    assert states[key].provider_message_id == accepted_once(fake, key)
    assert len(sends(fake, key)) == 2  # the retry reached the provider, which deduped it
    events = await read_topic(settings.kafka.topic_deliveries)
    retries = [e for e in events if e.type == "delivery.retry_scheduled"]
    assert [r.dedupe_rule for r in retries] == ["idempotency-key-24h"]
    assert "24 h" in retries[0].safety
    await live_projection.matches(await ledger_view())
