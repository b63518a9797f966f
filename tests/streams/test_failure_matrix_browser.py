"""The failure-matrix rows of the browser channel, against the fake form.

Real broker, real ``ledger worker`` processes driving Debian's Chromium (a crash is a real
SIGKILL at an exact fault point), the fake form, which does NOT dedupe: a second submit is
a second accepted entry. Every row checks the ledger's final state AND the target: exactly
one accepted submission per idempotency key (none for a rejected one). The rows that end
in a lookup run with both of the target's lookups: its JSON list (``[list]``) and its
search page read in Chromium (``[search]``).
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from pydantic import JsonValue, Secret

from clients import DeliverySpec
from config.settings import Settings, changed
from events.delivery_state import Status
from events.retry_policy import RetryPolicy
from tests.fixtures.form import TARGET, BackgroundFakeForm, Lookup, form_target
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import LedgerView, WorkerFactory
from tests.streams.matrix import publish, until

# Chromium needs more than the HTTP rows' 1.5 s on a busy machine, and the lease must also
# cover its first launch and the page before the submit (the lease rule checks there).
DEADLINE_S = 5.0


LOOKUPS = pytest.mark.parametrize("lookup", ["list", "search"])


def use_form(
    factory: WorkerFactory, form: BackgroundFakeForm, *, lookup: Lookup | None = "list"
) -> Settings:
    """Point the workers' browser channel at the fake form (target ``tickets``)."""
    config = Secret[dict[str, JsonValue]](
        {"targets": {TARGET: form_target(form.app.url, lookup=lookup)}}
    )
    factory.settings = changed(
        factory.settings,
        {
            "channels.settings": {"browser": config},
            "channels.allowed_networks": ["127.0.0.0/8"],
            "channels.send_deadline_s": DEADLINE_S,
            "worker.lease_s": 12.0,
        },
    )
    return factory.settings


async def publish_one(settings: Settings, run_id: str) -> str:
    spec = DeliverySpec(
        channel="browser", recipient=TARGET, payload={"title": f"{run_id} failed", "body": "x"}
    )
    [key] = await publish(settings, run_id, [spec])
    return key


def accepted_once(form: BackgroundFakeForm, key: str) -> str:
    """Exactly one accepted submission carries ``key``; the target's id for it."""
    accepted = form.app.accepted(key)
    assert len(accepted) == 1, [s.id for s in accepted]
    return accepted[0].id


@LOOKUPS
async def test_browser_crash_after_accept_is_unknown_then_confirmed_by_lookup(
    worker_factory: WorkerFactory,
    fake_form: BackgroundFakeForm,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
    lookup: Lookup,
) -> None:
    settings = use_form(worker_factory, fake_form, lookup=lookup)
    live_projection.settings = settings
    live_projection.start()
    key = await publish_one(settings, "run-b1")
    fake_form.app.fault("crash", key=key)  # accepted, then the connection dies mid-answer
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED by lookup")
    state = states[key]
    # On a busy machine the first attempt may spend its lease launching Chromium and be
    # refused by the lease rule before the submit (attempt 2, nothing submitted by 1): the
    # target's count of submissions is what proves nothing was resubmitted.
    assert state.last_error_class == "reset_after_write"
    assert state.provider_message_id == accepted_once(fake_form, key)
    assert fake_form.app.posts == 1
    assert state.reconciled == "found"
    await live_projection.matches(await ledger_view())


async def test_browser_rejected_form_fails_and_nothing_is_accepted(
    worker_factory: WorkerFactory, fake_form: BackgroundFakeForm, ledger_view: LedgerView
) -> None:
    settings = use_form(worker_factory, fake_form)
    key = await publish_one(settings, "run-b2")
    fake_form.app.fault("reject", key=key, reason="duplicate title")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED")
    assert states[key].last_error_class == "provider_rejected"
    assert "#rejected" in (states[key].last_reason or "")
    assert fake_form.app.accepted(key) == []
    assert fake_form.app.posts == 1, "a rejection is never resubmitted"


async def test_browser_slow_submit_past_the_deadline_is_settled_by_lookup(
    worker_factory: WorkerFactory, fake_form: BackgroundFakeForm, ledger_view: LedgerView
) -> None:
    settings = use_form(worker_factory, fake_form)
    key = await publish_one(settings, "run-b3")
    fake_form.app.fault("slow", key=key, delay_s=DEADLINE_S + 3)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED by lookup")
    assert states[key].last_error_class == "timeout_after_write"
    assert states[key].provider_message_id == accepted_once(fake_form, key)
    assert fake_form.app.posts == 1


async def test_browser_worker_killed_after_the_submit_is_settled_by_lookup(
    worker_factory: WorkerFactory,
    fake_form: BackgroundFakeForm,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_form(worker_factory, fake_form)
    live_projection.settings = settings
    live_projection.start()
    key = await publish_one(settings, "run-b4")
    # Killed once the page answered, before its outcome reached the log.
    doomed = worker_factory.start("w1", faults=("worker.after_response",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert len(fake_form.app.accepted(key)) == 1  # the target had it when the worker died
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after kill")
    assert states[key].provider_message_id == accepted_once(fake_form, key)
    assert fake_form.app.posts == 1, "nothing may be submitted twice after the crash"
    await live_projection.matches(await ledger_view())


@LOOKUPS
async def test_browser_worker_killed_before_the_submit_is_looked_up_then_submitted_once(
    worker_factory: WorkerFactory,
    fake_form: BackgroundFakeForm,
    ledger_view: LedgerView,
    lookup: Lookup,
) -> None:
    settings = use_form(worker_factory, fake_form, lookup=lookup)
    key = await publish_one(settings, "run-b5")
    # Killed with the claim in the log and nothing opened: the lease expires into UNKNOWN,
    # and only "not found" at the target (twice) lets the next worker submit.
    doomed = worker_factory.start("w1", faults=("worker.before_send",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert fake_form.app.posts == 0
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after kill")
    assert states[key].attempt >= 2
    assert states[key].provider_message_id == accepted_once(fake_form, key)
    assert fake_form.app.posts == 1


async def test_browser_login_page_submits_nothing_and_fails_after_its_attempts(
    worker_factory: WorkerFactory, fake_form: BackgroundFakeForm, ledger_view: LedgerView
) -> None:
    settings = use_form(worker_factory, fake_form)
    # Two quick attempts: a login page is "nothing submitted", so each is retried.
    policies = {
        **settings.channels.retry_policies,
        "browser": RetryPolicy(base_delay_s=0.5, max_attempts=2),
    }
    worker_factory.settings = settings = changed(settings, {"channels.retry_policies": policies})
    fake_form.app.login_required(True)  # the form redirects to its login page
    key = await publish_one(settings, "run-b6")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED at the login")
    state = states[key]
    assert state.last_error_class == "login_page"
    assert state.attempt >= 2  # a first attempt refused by the lease rule adds one
    assert "/login" in (state.last_reason or "")
    assert "(screenshot " in (state.last_reason or "")
    assert (fake_form.app.posts, fake_form.app.accepted()) == (0, [])


async def test_browser_submit_slower_than_the_global_deadline_is_confirmed_under_its_own(
    worker_factory: WorkerFactory, fake_form: BackgroundFakeForm, ledger_view: LedgerView
) -> None:
    # The global deadline (1.5 s) would time the submit out after the write (UNKNOWN, then
    # a lookup); the browser's own deadline (LEDGER_CHANNELS__SEND_DEADLINES) lets the page answer.
    settings = use_form(worker_factory, fake_form)
    settings = worker_factory.settings = changed(
        settings,
        {
            "channels.send_deadline_s": 1.5,
            "channels.http_timeout_s": 1.0,
            "channels.send_deadlines": {"browser": 3 * DEADLINE_S},
            # Slack beyond deadline + margin for a Chromium launch on a loaded machine:
            # with 4.5 s the lease rule once refused the send (attempt 2, correctly).
            "worker.lease_s": 3 * DEADLINE_S + 15,
        },
    )
    key = await publish_one(settings, "run-b7")
    fake_form.app.fault("slow", key=key, delay_s=3.0)  # accepted, answered 3 s later
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED")
    state = states[key]
    assert state.attempt == 1
    assert state.last_error_class is None, state.last_reason  # confirmed by the page itself
    assert state.provider_message_id == accepted_once(fake_form, key)
    assert fake_form.app.posts == 1
