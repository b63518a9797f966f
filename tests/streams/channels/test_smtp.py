"""The smtp channel against a real SMTP server (aiosmtpd) and a real IMAP server (dovecot):
every SMTP phase classified, the Message-ID deterministic, the guard before the message,
the archive lookup by Message-ID."""

from __future__ import annotations

import asyncio
import imaplib
import time
from email.message import EmailMessage

import aiosmtplib
import pytest
from pydantic import SecretStr, ValidationError

from clients import DeliverySpec
from events.admission import refusal
from events.channels.mail import SmtpSettings, check_email_recipient
from events.outcomes import ErrorClass
from streams.channels.base import SendOutcome
from streams.channels.imap_lookup import ArchiveLookup
from streams.channels.mail_origin import ORIGIN_HEADER, origin_seal
from streams.channels.smtp import SmtpChannel, message_id
from streams.channels.write_guard import WriteGuard
from tests.fixtures.mail import DOMAIN, ORIGIN_KEY, MailStack, free_port
from tests.streams.channels.support import outbound

TO = "ops@example.org"


def channel(stack: MailStack, deadline_s: float = 3.0, **overrides: object) -> SmtpChannel:
    config = SmtpSettings.model_validate(stack.config(**overrides))
    lookup = ArchiveLookup(config, deadline_s=deadline_s) if config.imap_host else None
    return SmtpChannel(config, deadline_s=deadline_s, lookup=lookup)


async def test_250_is_sent_with_the_key_as_message_id_and_headers(mail_stack: MailStack) -> None:
    delivery = outbound(TO, "smtp", payload={"subject": "Report", "text": "it is ready"})
    result = await channel(mail_stack).send(delivery, WriteGuard())
    mid = message_id(delivery.idempotency_key, DOMAIN)
    assert result.outcome is SendOutcome.SENT, result.evidence
    assert result.provider_message_id == mid
    assert "250" in result.evidence
    [msg] = mail_stack.smtp.messages(mid)
    assert msg["Idempotency-Key"] == delivery.idempotency_key
    assert msg["Fencing-Token"] == "1"
    assert msg["To"] == TO
    assert msg["Subject"] == "Report"
    assert "it is ready" in msg.get_payload()


async def test_lookup_finds_the_archived_copy_by_message_id(mail_stack: MailStack) -> None:
    smtp = channel(mail_stack)
    delivery = outbound(TO, "smtp")
    assert (await smtp.send(delivery)).outcome is SendOutcome.SENT
    found = await smtp.lookup(delivery)
    assert found.outcome == "found", found.evidence
    assert found.delivered
    assert found.provider_message_id is not None
    assert found.provider_message_id.startswith("INBOX/")
    assert "UID 1" in found.evidence
    missing = await smtp.lookup(outbound(TO, "smtp"))
    assert missing.outcome == "not_found", missing.evidence


async def test_lookup_with_a_wrong_password_is_a_lookup_error(mail_stack: MailStack) -> None:
    result = await channel(mail_stack, imap_password="wrong").lookup(outbound(TO, "smtp"))
    assert result.outcome == "lookup_error"
    assert "wrong" not in result.evidence


async def test_no_archive_means_no_lookup(mail_stack: MailStack) -> None:
    smtp = channel(mail_stack, imap_host=None, imap_port=None)
    assert (await smtp.lookup(outbound(TO, "smtp"))).outcome == "unsupported"


async def test_dropped_connection_after_data_is_unknown(mail_stack: MailStack) -> None:
    mail_stack.smtp.fault(TO, "drop_after_data")
    delivery = outbound(TO, "smtp")
    result = await channel(mail_stack).send(delivery)
    assert result.outcome is SendOutcome.UNKNOWN, result.evidence
    assert result.error_class is ErrorClass.RESET_AFTER_WRITE
    assert len(mail_stack.smtp.messages(message_id(delivery.idempotency_key, DOMAIN))) == 1


async def test_no_reply_after_data_within_the_deadline_is_unknown(mail_stack: MailStack) -> None:
    mail_stack.smtp.fault(TO, "delay_after_data", delay_s=2.0)
    result = await channel(mail_stack, deadline_s=1.0).send(outbound(TO, "smtp"))
    assert result.outcome is SendOutcome.UNKNOWN, result.evidence
    assert result.error_class is ErrorClass.TIMEOUT_AFTER_WRITE


async def test_421_before_data_is_not_sent(mail_stack: MailStack) -> None:
    mail_stack.smtp.fault(TO, "reply_421")
    result = await channel(mail_stack).send(outbound(TO, "smtp"))
    assert result.outcome is SendOutcome.NOT_SENT, result.evidence
    assert result.error_class is ErrorClass.SMTP_4XX
    assert "RCPT TO -> 421" in result.evidence
    assert mail_stack.smtp.messages() == []


async def test_550_is_rejected(mail_stack: MailStack) -> None:
    mail_stack.smtp.fault(TO, "reply_550")
    result = await channel(mail_stack).send(outbound(TO, "smtp"))
    assert result.outcome is SendOutcome.REJECTED, result.evidence
    assert result.error_class is ErrorClass.SMTP_5XX
    assert mail_stack.smtp.messages() == []


async def test_4xx_after_the_message_is_a_doubt_not_a_retry(mail_stack: MailStack) -> None:
    mail_stack.smtp.fault(TO, "reply_451_after_data")
    result = await channel(mail_stack).send(outbound(TO, "smtp"))
    # TRANSIENT with a class outside NOT_PROCESSED: the state machine records UNKNOWN.
    assert result.outcome is SendOutcome.TRANSIENT, result.evidence
    assert result.error_class is ErrorClass.SMTP_4XX


async def test_the_guard_runs_after_354_and_its_refusal_sends_nothing(
    mail_stack: MailStack,
) -> None:
    seen: list[int] = []

    def check() -> str | None:
        seen.append(mail_stack.smtp.transactions(TO))  # RCPT was already accepted
        return "lease has 0.1s left"

    guard = WriteGuard(check)
    result = await channel(mail_stack).send(outbound(TO, "smtp"), guard)
    assert result.outcome is SendOutcome.NOT_SENT
    assert result.error_class is ErrorClass.FENCED
    assert seen == [1]
    assert not guard.written
    assert mail_stack.smtp.messages() == []


async def test_connection_refused_is_not_sent(mail_stack: MailStack) -> None:
    result = await channel(mail_stack, port=free_port()).send(outbound(TO, "smtp"))
    assert result.outcome is SendOutcome.NOT_SENT, result.evidence
    assert result.error_class is ErrorClass.CONNECT_REFUSED


async def test_a_subject_cannot_inject_headers(mail_stack: MailStack) -> None:
    payload = {"subject": "hi\r\nBcc: victim@example.org", "text": "x"}
    delivery = outbound(TO, "smtp", payload=payload)
    assert (await channel(mail_stack).send(delivery)).outcome is SendOutcome.SENT
    [msg] = mail_stack.smtp.messages()
    assert msg["Bcc"] is None
    assert msg["Subject"] == "hi Bcc: victim@example.org"


async def test_without_from_address_nothing_is_sent(mail_stack: MailStack) -> None:
    smtp = channel(mail_stack, from_address=None, message_id_domain=None)
    result = await smtp.send(outbound(TO, "smtp"))
    assert result.outcome is SendOutcome.REJECTED
    assert "from_address" in result.evidence


@pytest.mark.parametrize(
    ("recipient", "says"),
    [
        ("ops@example.org", None),
        ("first.last+tag@sub.example.co.uk", None),
        ("ops@[127.0.0.1]", None),
        ("Ops <ops@example.org>", "no display name"),
        ("ops@example.org\r\nBcc: x@example.org", "line break"),
        ("ops@example.org, x@example.org", "no display name"),
        ("ops", "must look like"),
        ("ops@exa_mple.org", "not a host name"),
        (".ops@example.org", "dot-atom"),
        ("ops@example.org\x07", "control characters"),
    ],
)
def test_email_recipient_form(recipient: str, says: str | None) -> None:
    if says is None:
        check_email_recipient(recipient)
        return
    with pytest.raises(ValueError, match=says) as caught:
        check_email_recipient(recipient)
    assert "\n" not in str(caught.value)


def forged(mid: str, key: str, seal: str | None = None) -> EmailMessage:
    """Someone else's message with our Message-ID and key headers (and maybe a seal)."""
    msg = EmailMessage()
    msg["From"] = "mallory@example.net"
    msg["To"] = "someone@example.org"
    msg["Subject"] = "not from the ledger"
    msg["Message-ID"] = mid
    msg["Idempotency-Key"] = key
    if seal is not None:
        msg[ORIGIN_HEADER] = seal
    msg.set_content("forged")
    return msg


def append_to_archive(stack: MailStack, msg: EmailMessage) -> None:
    """APPEND over IMAP, as anyone holding the archive's login could."""
    assert stack.imap is not None
    imap = imaplib.IMAP4("127.0.0.1", stack.imap.port, timeout=10)
    try:
        imap.login(stack.imap.username, stack.imap.password)
        status, _ = imap.append("INBOX", None, imaplib.Time2Internaldate(time.time()), bytes(msg))
        assert status == "OK"
    finally:
        imap.logout()


async def test_every_message_carries_the_origin_seal_of_its_message_id(
    mail_stack: MailStack,
) -> None:
    delivery = outbound(TO, "smtp")
    assert (await channel(mail_stack).send(delivery)).outcome is SendOutcome.SENT
    mid = message_id(delivery.idempotency_key, DOMAIN)
    [msg] = mail_stack.smtp.messages(mid)
    assert msg[ORIGIN_HEADER] == origin_seal(SecretStr(ORIGIN_KEY), mid)
    assert msg[ORIGIN_HEADER].startswith("v1=")
    assert ORIGIN_KEY not in msg.as_string()


async def test_a_copy_with_our_message_id_that_we_did_not_send_is_not_ours(
    mail_stack: MailStack,
) -> None:
    # Two others file our Message-ID in the archive before we send: one mails it through
    # the relay (which journals everything), one APPENDs it over IMAP with a seal made
    # under another key. Neither may confirm the key; our own copy, sent after, does.
    smtp = channel(mail_stack)
    delivery = outbound(TO, "smtp")
    key = delivery.idempotency_key
    mid = message_id(key, DOMAIN)
    await aiosmtplib.send(forged(mid, key), hostname="127.0.0.1", port=mail_stack.smtp.port)
    wrong = origin_seal(SecretStr("another-key-entirely-0123456789"), mid)
    await asyncio.to_thread(append_to_archive, mail_stack, forged(mid, key, wrong))
    missing = await smtp.lookup(delivery)
    assert missing.outcome == "not_found", missing.evidence
    assert not missing.delivered
    assert "2 with it but without our X-Ledger-Origin, not taken: UIDs 1 2" in missing.evidence
    assert (await smtp.send(delivery)).outcome is SendOutcome.SENT
    found = await smtp.lookup(delivery)
    assert (found.outcome, found.delivered) == ("found", True), found.evidence
    assert found.provider_message_id is not None
    assert found.provider_message_id.endswith("/3"), found.evidence  # our copy's UID
    assert "X-Ledger-Origin verified" in found.evidence


async def test_our_seal_on_another_message_id_is_not_ours(mail_stack: MailStack) -> None:
    # A seal copied from one of our messages proves nothing about another Message-ID.
    smtp = channel(mail_stack)
    sent, target = outbound(TO, "smtp"), outbound(TO, "smtp")
    assert (await smtp.send(sent)).outcome is SendOutcome.SENT
    [ours] = mail_stack.smtp.messages(message_id(sent.idempotency_key, DOMAIN))
    mid = message_id(target.idempotency_key, DOMAIN)
    await asyncio.to_thread(
        append_to_archive, mail_stack, forged(mid, target.idempotency_key, ours[ORIGIN_HEADER])
    )
    result = await smtp.lookup(target)
    assert result.outcome == "not_found", result.evidence


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"origin_key": None}, "an IMAP lookup needs origin_key"),
        ({"origin_key": "short"}, "origin_key must be at least 24 bytes"),
    ],
)
def test_an_imap_lookup_needs_an_origin_key(
    mail_stack: MailStack, overrides: dict[str, object], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        SmtpSettings.model_validate({**mail_stack.config(), **overrides})
    # Without a lookup the key is optional (nothing would check the seal).
    SmtpSettings.model_validate({**mail_stack.config(imap_host=None), "origin_key": None})


@pytest.mark.parametrize(
    "recipient",
    [
        "ops@[127.0.0.1]",
        "ops@[192.0.2.7]",
        "ops@[10.0.0.5]",
        "ops@localhost",
        "ops@LocalHost",
        "ops@mail.localhost",
    ],
)
@pytest.mark.parametrize("channel_name", ["smtp", "email_api"])
def test_an_address_literal_or_localhost_recipient_is_refused_at_admission(
    recipient: str, channel_name: str
) -> None:
    """Well-formed (an event carrying one still decodes), but never requested: the relay
    would deliver into its own host or network."""
    check_email_recipient(recipient)
    with pytest.raises(ValueError, match="may not") as caught:
        DeliverySpec(channel=channel_name, recipient=recipient, payload={"subject": "s"})
    assert "use the recipient's domain name" in str(caught.value)
    # The worker applies the same rule right before a send (REFUSED_REQUEST, nothing sent).
    reason = refusal(channel_name, recipient, {}, 1_000_000)
    assert reason is not None
    assert "\n" not in reason
    assert refusal(channel_name, "ops@example.org", {}, 1_000_000) is None


@pytest.mark.parametrize("breaker", ["\u2028", "\u2029", "\x85", "\x0b", "\x1c"])
async def test_a_subject_with_a_unicode_line_break_is_folded_and_sent(
    mail_stack: MailStack, breaker: str
) -> None:
    """Python's email package takes these for line ends and raised before connecting; the
    worker then recorded UNKNOWN for a message that never left."""
    payload = {"subject": f"disk{breaker}full", "text": f"on{breaker}db-1"}
    delivery = outbound(TO, "smtp", payload=payload)
    result = await channel(mail_stack).send(delivery)
    assert result.outcome is SendOutcome.SENT, result.evidence
    [msg] = mail_stack.smtp.messages()
    assert msg["Subject"] == "disk full"


async def test_a_payload_that_cannot_become_an_email_is_refused_before_connecting(
    mail_stack: MailStack,
) -> None:
    delivery = outbound(TO, "smtp", payload={"subject": "s", "text": "lone \ud800 surrogate"})
    result = await channel(mail_stack).send(delivery)
    assert (result.outcome, result.error_class) == (
        SendOutcome.REJECTED,
        ErrorClass.REFUSED_REQUEST,
    )
    assert "cannot become an email" in result.evidence
    assert "\n" not in result.evidence
    assert mail_stack.smtp.messages() == []
