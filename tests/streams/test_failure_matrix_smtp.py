"""The failure-matrix rows that apply to email over SMTP, at the SMTP server's Maildir.

Real broker, real ``ledger worker`` processes, a real SMTP server (aiosmtpd) that does NOT
dedupe (a second message with one Message-ID is a second file), a real IMAP server
(dovecot) over the relay's archive copy. Every row checks the ledger's final state AND the
Maildir: messages counted by Message-ID, exactly one per logical event (none for a refused
one; two identical Message-IDs where the endpoint declared that its receiver drops them).
"""

from __future__ import annotations

import asyncio
import signal
from email.message import EmailMessage
from typing import Any

import aiosmtplib
from pydantic import SecretStr

from clients import DeliverySpec
from config.settings import Settings, changed
from events.delivery_state import Status
from events.retry_policy import RetryPolicy
from streams.channels.mail_origin import ORIGIN_HEADER, sealed_by_us
from streams.channels.smtp import message_id
from tests.fixtures.broker import ReadTopic
from tests.fixtures.mail import DOMAIN, ORIGIN_KEY, MailStack
from tests.fixtures.projection import LiveProjection
from tests.fixtures.worker import LedgerView, WorkerFactory, wait_for
from tests.streams.matrix import publish, until

TO = "ops@example.org"


def use_mail(
    factory: WorkerFactory, stack: MailStack, projection: LiveProjection, **config: Any
) -> Settings:
    """Point the workers at the mail stack and start the live projection beside them."""
    # The smtp default waits a minute after a 4xx (greylisting); a test cannot.
    fast = RetryPolicy(base_delay_s=0.5, max_delay_s=2.0)
    policies = {**factory.settings.channels.retry_policies, "smtp": fast}
    factory.settings = changed(
        stack.settings(factory.settings, **config), {"channels.retry_policies": policies}
    )
    projection.settings = factory.settings
    projection.start()
    return factory.settings


async def publish_one(settings: Settings, run_id: str) -> str:
    spec = DeliverySpec(channel="smtp", recipient=TO, payload={"text": f"{run_id} is ready"})
    [key] = await publish(settings, run_id, [spec])
    return key


def copies(stack: MailStack, key: str) -> int:
    """Messages in the Maildir with this key's Message-ID."""
    return len(stack.smtp.messages(message_id(key, DOMAIN)))


def ours(stack: MailStack, key: str) -> int:
    """Those of them the ledger sent: their X-Ledger-Origin verifies."""
    mid = message_id(key, DOMAIN)
    sealed = [
        m
        for m in stack.smtp.messages(mid)
        if sealed_by_us(SecretStr(ORIGIN_KEY), mid, m.get_all(ORIGIN_HEADER) or [])
    ]
    return len(sealed)


async def test_smtp_drop_after_data_is_unknown_then_confirmed_by_imap_lookup(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(worker_factory, mail_stack, live_projection)
    mail_stack.smtp.fault(TO, "drop_after_data")
    key = await publish_one(settings, "run-m1")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED by IMAP")
    state = states[key]
    assert state.attempt == 1, "an UNKNOWN must never be re-sent when the lookup finds it"
    assert state.last_error_class == "reset_after_write"
    assert "lookup by idempotency key" in (state.last_reason or "")
    assert (state.provider_message_id or "").startswith("INBOX/")
    assert copies(mail_stack, key) == 1
    assert mail_stack.smtp.transactions(TO) == 1
    await live_projection.matches(await ledger_view())


async def test_smtp_421_before_data_is_retried_and_sent_once(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(worker_factory, mail_stack, live_projection)
    mail_stack.smtp.fault(TO, "reply_421")
    key = await publish_one(settings, "run-m2")
    worker = worker_factory.start("w1")
    # 250 is SENT; the archive lookup then confirms it.
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED after 421")
    assert states[key].attempt == 2
    assert copies(mail_stack, key) == 1
    assert mail_stack.smtp.transactions(TO) == 2
    await live_projection.matches(await ledger_view())


async def test_smtp_550_fails_and_delivers_nothing(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(worker_factory, mail_stack, live_projection)
    mail_stack.smtp.fault(TO, "reply_550")
    key = await publish_one(settings, "run-m3")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.FAILED}, [worker], "FAILED")
    assert states[key].last_error_class == "smtp_5xx"
    assert "550" in (states[key].last_reason or "")
    assert copies(mail_stack, key) == 0
    assert mail_stack.smtp.messages() == []
    assert mail_stack.smtp.transactions(TO) == 1, "a permanent refusal is never retried"
    await live_projection.matches(await ledger_view())


async def test_smtp_drop_after_data_without_lookup_or_dedupe_stays_unknown(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(worker_factory, mail_stack, live_projection, imap_host=None, imap_port=None)
    mail_stack.smtp.fault(TO, "drop_after_data")
    key = await publish_one(settings, "run-m4")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.UNKNOWN}, [worker], "UNKNOWN")
    assert states[key].last_error_class == "reset_after_write"
    # Past the settle window the lookup answers "unsupported"; nothing may be re-sent.

    async def reconciled() -> bool:
        return (await ledger_view())[key].reconciled == "unsupported"

    await wait_for(reconciled, 30, "the lookup answered unsupported")
    final = (await ledger_view())[key]
    assert final.status is Status.UNKNOWN
    assert final.attempt == 1
    assert copies(mail_stack, key) == 1
    assert mail_stack.smtp.transactions(TO) == 1
    await live_projection.matches(await ledger_view())


async def test_smtp_drop_after_data_with_message_id_dedupe_resends_the_same_message_id(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    read_topic: ReadTopic,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(
        worker_factory,
        mail_stack,
        live_projection,
        imap_host=None,
        imap_port=None,
        receiver_dedupes_message_id=True,
    )
    mail_stack.smtp.fault(TO, "drop_after_data")
    key = await publish_one(settings, "run-m5")
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.SENT}, [worker], "SENT after the retry")
    assert states[key].attempt == 2
    # This server does not dedupe, so the retry shows: two copies, one Message-ID. A
    # receiver that keeps the declared promise would have kept one.
    mid = message_id(key, DOMAIN)
    both = mail_stack.smtp.messages(mid)
    assert len(both) == 2
    assert [m["Message-ID"] for m in both] == [mid, mid]
    assert [m["Idempotency-Key"] for m in both] == [key, key]
    assert sorted(m["Fencing-Token"] for m in both) == ["1", "2"]
    events = await read_topic(settings.kafka.topic_deliveries)
    [retry] = [e for e in events if e.type == "delivery.retry_scheduled"]
    assert retry.dedupe_rule == "message-id"  # the channel's rule, named in the event
    assert "receiver_dedupes_message_id=true" in retry.safety
    await live_projection.matches(await ledger_view())


async def test_smtp_another_senders_message_with_the_message_id_does_not_confirm_it(
    worker_factory: WorkerFactory,
    mail_stack: MailStack,
    ledger_view: LedgerView,
    live_projection: LiveProjection,
) -> None:
    settings = use_mail(worker_factory, mail_stack, live_projection)
    key = await publish_one(settings, "run-m6")
    # Killed with the claim in the log and nothing sent: the lease expires into UNKNOWN.
    doomed = worker_factory.start("w1", faults=("worker.before_send",))
    await asyncio.to_thread(doomed.process.wait, 60)
    assert doomed.process.returncode == -signal.SIGKILL
    assert copies(mail_stack, key) == 0
    # Someone else mails our Message-ID through the relay, which files it in the archive
    # like everything it accepts. It is not our delivery: only "not found" of OUR copy
    # (twice) may let the next worker send, once.
    other = EmailMessage()
    other["From"], other["To"], other["Subject"] = "mallory@example.net", TO, "not ours"
    other["Message-ID"] = message_id(key, DOMAIN)
    other["Idempotency-Key"] = key
    other.set_content("forged")
    await aiosmtplib.send(other, hostname="127.0.0.1", port=mail_stack.smtp.port)
    worker = worker_factory.start("w1")
    states = await until(ledger_view, [key], {Status.CONFIRMED}, [worker], "CONFIRMED, ours")
    state = states[key]
    assert state.attempt >= 2, "a copy we did not send may not settle the UNKNOWN"
    assert (state.provider_message_id or "").endswith("/2"), state.provider_message_id
    assert ours(mail_stack, key) == 1  # exactly one of ours at the receiver
    assert copies(mail_stack, key) == 2  # and the other sender's, untouched
    assert mail_stack.smtp.transactions(TO) == 2
    await live_projection.matches(await ledger_view())
