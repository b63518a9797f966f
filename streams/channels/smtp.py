"""The smtp channel: one email per logical event, its Message-ID made of the idempotency key.

``Message-ID: <KEY@DOMAIN>``, ``Idempotency-Key: KEY`` and ``Fencing-Token: N`` headers, and
with an ``origin_key`` the seal ``X-Ledger-Origin`` (streams/channels/mail_origin.py). The
SMTP transaction is classified by how far it got, because only the end of DATA hands a
message over:

* anything refused or lost before the message text is written (connect, EHLO, STARTTLS,
  AUTH, MAIL, RCPT, the DATA command): nothing was handed over. A 4xx is "try later"
  (NOT_SENT, retried), a 5xx is final (REJECTED), a connection failure is NOT_SENT.
* ``250`` after the message: a relay took it (SENT; nobody has read it yet).
* a timeout or a dropped connection after the message text started: UNKNOWN. So is a 4xx
  after it (the relay says it did not take it, but a doubt is settled by the lookup).
* ``5xx`` after the message: REJECTED.

The write guard runs after the server's ``354`` and right before the first byte of the
message text; the whole transaction runs under the hard total deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email import policy
from email.errors import MessageError
from email.message import EmailMessage
from email.utils import format_datetime

import aiosmtplib
from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings

from events.channels.mail import SmtpSettings, email_problem
from events.keys import canonical_json
from events.outcomes import ErrorClass, LookupOutcome
from streams.channels.base import (
    AdapterBuild,
    LookupResult,
    OutboundDelivery,
    SendOutcome,
    SendResult,
)
from streams.channels.imap_lookup import ArchiveLookup
from streams.channels.mail_origin import ORIGIN_HEADER, origin_seal
from streams.channels.write_guard import SendRefused, WriteGuard, unguarded

KEY_HEADER = "Idempotency-Key"
FENCING_HEADER = "Fencing-Token"
ATTEMPT_HEADER = "X-Ledger-Attempt"
# Control characters, and every other character Python's email package takes for a line
# end (NEL U+0085, U+2028, U+2029, C1 controls): in a header it would raise on the way out.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
MAX_SUBJECT = 200
QUIT_WAIT_S = 0.5  # a polite QUIT once the outcome is known; it changes nothing
# CRLF, and no folding below RFC 5322's 998: a 64-hex key stays on its header's line.
_POLICY = policy.SMTP.clone(max_line_length=998)


def message_id(key: str, domain: str) -> str:
    """The deterministic Message-ID of every attempt of one logical event."""
    return f"<{key}@{domain}>"


def _one_line(text: str, limit: int) -> str:
    return _CONTROL.sub(" ", text).strip()[:limit]


def build_message(delivery: OutboundDelivery, config: SmtpSettings, now: datetime) -> bytes:
    """The message of one attempt, as bytes with CRLF line ends.

    A payload object may give ``subject``, ``text`` and ``html``; otherwise the payload is
    the text (a string as it is, anything else as canonical JSON) under a subject naming
    the event and the run.
    """
    payload = delivery.payload
    fields = payload if isinstance(payload, dict) else {}
    subject = fields.get("subject")
    text = fields.get("text")
    html = fields.get("html")
    if not isinstance(subject, str):
        subject = f"{delivery.event_type}: run {delivery.run_id}"
    if not isinstance(text, str):
        text = payload if isinstance(payload, str) else canonical_json(payload).decode()
    domain = config.id_domain
    assert config.from_address is not None
    assert domain is not None
    msg = EmailMessage(policy=_POLICY)
    msg["From"] = config.from_address
    msg["To"] = delivery.recipient
    # Control characters in a header could start a header of their own: never let one through.
    msg["Subject"] = _one_line(subject, MAX_SUBJECT)
    msg["Date"] = format_datetime(now)
    mid = message_id(delivery.idempotency_key, domain)
    msg["Message-ID"] = mid
    if config.origin_key is not None:
        msg[ORIGIN_HEADER] = origin_seal(config.origin_key, mid)
    msg[KEY_HEADER] = delivery.idempotency_key
    msg[FENCING_HEADER] = str(delivery.fencing_token)
    msg[ATTEMPT_HEADER] = str(delivery.attempt)
    msg.set_content(text)
    if isinstance(html, str):
        msg.add_alternative(html, subtype="html")
    return msg.as_bytes()


def _data_bytes(message: bytes) -> bytes:
    """The message as DATA carries it: CRLF line ends, dot-stuffed, ended by ``.``."""
    return PERIOD_REGEX.sub(b"..", normalize_message_line_endings(message)) + b".\r\n"


class _Refused(Exception):
    """An SMTP reply that ends the transaction, with the phase it came in."""

    def __init__(self, phase: str, code: int, text: str) -> None:
        super().__init__(f"{phase} -> {code} {_one_line(text, 300)}")
        self.phase = phase
        self.code = code


def _before_data(exc: _Refused, what: str) -> SendResult:
    evidence = f"{what}: not sent: {exc}"
    if 400 <= exc.code <= 499:
        return SendResult(SendOutcome.NOT_SENT, evidence, ErrorClass.SMTP_4XX)
    if 500 <= exc.code <= 599:
        return SendResult(SendOutcome.REJECTED, evidence, ErrorClass.SMTP_5XX)
    return SendResult(SendOutcome.NOT_SENT, evidence, ErrorClass.PROTOCOL_ERROR)


def _connect_failure(exc: BaseException, what: str) -> SendResult:
    detail = f"{what}: not sent: {type(exc).__name__}: {exc}"[:1000]
    if isinstance(exc, aiosmtplib.SMTPConnectTimeoutError):
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.CONNECT_TIMEOUT)
    causes: list[BaseException] = [exc]
    while (cause := causes[-1].__cause__ or causes[-1].__context__) and len(causes) < 10:
        causes.append(cause)
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.CONNECT_REFUSED)
    return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.CONNECT_FAILED)


class SmtpChannel:
    """An SMTP client per attempt (aiosmtplib); lookup in an IMAP archive mailbox."""

    name = "smtp"

    def __init__(
        self,
        config: SmtpSettings,
        *,
        deadline_s: float,
        lookup: ArchiveLookup | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._deadline_s = deadline_s
        self._lookup = lookup
        self._clock = clock

    def receiver_dedupes(self, recipient: str) -> bool:
        """The settings' declaration (receiver_dedupes_message_id), never a default."""
        del recipient
        return self._config.receiver_dedupes_message_id

    def settle_s(self, recipient: str) -> float | None:
        """How long the relay may take to file an accepted message in the archive."""
        del recipient
        return self._config.settle_s

    def _unsendable(self, delivery: OutboundDelivery) -> str | None:
        if self._config.from_address is None:
            return "the smtp channel has no from_address (LEDGER_CHANNELS__SETTINGS smtp)"
        return email_problem(delivery.recipient)

    async def send(self, delivery: OutboundDelivery, guard: WriteGuard | None = None) -> SendResult:
        """One SMTP transaction under the hard deadline; the guard runs before the message."""
        cfg = self._config
        what = f"SMTP {cfg.host}:{cfg.smtp_port} to {delivery.recipient}"
        problem = self._unsendable(delivery)
        if problem is not None:
            return SendResult(
                SendOutcome.REJECTED, f"not sent: {problem}", ErrorClass.INVALID_RECIPIENT
            )
        now = datetime.fromtimestamp(self._clock(), UTC)
        try:
            data = _data_bytes(build_message(delivery, cfg, now))
        except (ValueError, TypeError, UnicodeError, MessageError) as exc:
            # Nothing connected yet: the payload cannot become a message, now or later.
            return SendResult(
                SendOutcome.REJECTED,
                f"{what}: not sent: the payload cannot become an email: "
                f"{type(exc).__name__}: {_one_line(str(exc), 300)}",
                ErrorClass.REFUSED_REQUEST,
            )
        guard = guard if guard is not None else unguarded()
        client = aiosmtplib.SMTP(
            hostname=cfg.host,
            port=cfg.smtp_port,
            use_tls=cfg.tls == "implicit",
            start_tls=cfg.tls == "starttls",
            validate_certs=cfg.validate_certs,
            cert_bundle=cfg.cert_bundle,
            username=cfg.username,
            password=cfg.password.get_secret_value() if cfg.password is not None else None,
            timeout=self._deadline_s,
        )
        try:
            try:
                async with asyncio.timeout(self._deadline_s):
                    return await self._transaction(client, delivery, data, guard, what)
            except TimeoutError:
                if guard.written:
                    return SendResult(
                        SendOutcome.UNKNOWN,
                        f"{what}: no answer to the message within the "
                        f"{self._deadline_s:g}s deadline",
                        ErrorClass.TIMEOUT_AFTER_WRITE,
                    )
                return SendResult(
                    SendOutcome.NOT_SENT,
                    f"{what}: not sent: the {self._deadline_s:g}s deadline struck before "
                    "the message",
                    ErrorClass.DEADLINE_BEFORE_WRITE,
                )
        finally:
            await self._hang_up(client)

    async def _transaction(
        self,
        client: aiosmtplib.SMTP,
        delivery: OutboundDelivery,
        data: bytes,
        guard: WriteGuard,
        what: str,
    ) -> SendResult:
        cfg = self._config
        assert cfg.from_address is not None
        try:
            await client.connect()
        except aiosmtplib.SMTPResponseException as exc:  # greeting, EHLO, STARTTLS, AUTH
            return _before_data(_Refused("connect", exc.code, exc.message), what)
        except (aiosmtplib.SMTPException, OSError) as exc:
            return _connect_failure(exc, what)
        try:
            try:
                await client.mail(cfg.from_address)
            except aiosmtplib.SMTPResponseException as exc:
                raise _Refused("MAIL FROM", exc.code, exc.message) from None
            try:
                await client.rcpt(delivery.recipient)
            except aiosmtplib.SMTPResponseException as exc:
                raise _Refused("RCPT TO", exc.code, exc.message) from None
            answer = await client.execute_command(b"DATA")
            if answer.code != 354:
                raise _Refused("DATA", answer.code, answer.message)
        except _Refused as exc:
            return _before_data(exc, what)
        except (aiosmtplib.SMTPException, OSError) as exc:
            # The connection failed before a byte of the message: nothing was handed over.
            detail = f"{what}: not sent: {type(exc).__name__}: {exc}"[:1000]
            return SendResult(SendOutcome.NOT_SENT, detail, ErrorClass.CONNECT_FAILED)
        protocol = client.protocol
        if protocol is None:
            return SendResult(
                SendOutcome.NOT_SENT, f"{what}: not sent: lost after 354", ErrorClass.CONNECT_FAILED
            )
        try:
            guard.before_first_byte()  # the lease rule: the last check before the message
        except SendRefused as exc:
            return SendResult(
                SendOutcome.NOT_SENT, f"{what}: not sent: {exc.reason}", ErrorClass.FENCED
            )
        try:
            protocol.write(data)
            reply = await protocol.read_response(timeout=self._deadline_s)
        except aiosmtplib.SMTPTimeoutError as exc:
            return SendResult(
                SendOutcome.UNKNOWN,
                f"{what}: {type(exc).__name__} after the message: {exc}"[:1000],
                ErrorClass.TIMEOUT_AFTER_WRITE,
            )
        except (aiosmtplib.SMTPException, OSError) as exc:
            return SendResult(
                SendOutcome.UNKNOWN,
                f"{what}: {type(exc).__name__} after the message, before its reply: {exc}"[:1000],
                ErrorClass.RESET_AFTER_WRITE,
            )
        return self._after_data(reply.code, reply.message, delivery, what)

    def _after_data(
        self, code: int, text: str, delivery: OutboundDelivery, what: str
    ) -> SendResult:
        reply = f"{code} {_one_line(text, 300)}"
        domain = self._config.id_domain or ""
        mid = message_id(delivery.idempotency_key, domain)
        if code == 250:
            return SendResult(
                SendOutcome.SENT,
                f"{what}: the relay accepted {mid}: {reply}",
                provider_message_id=mid,
                provider_status="relayed",
            )
        if 500 <= code <= 599:
            return SendResult(
                SendOutcome.REJECTED, f"{what}: message refused: {reply}", ErrorClass.SMTP_5XX
            )
        if 400 <= code <= 499:
            # The relay says it did not take it; but it has read the whole message, and a
            # relay that filed it before failing would leave a duplicate: look it up first.
            return SendResult(
                SendOutcome.TRANSIENT,
                f"{what}: {reply} after the message",
                ErrorClass.SMTP_4XX,
            )
        return SendResult(
            SendOutcome.UNKNOWN, f"{what}: unexpected reply {reply}", ErrorClass.PROTOCOL_ERROR
        )

    async def _hang_up(self, client: aiosmtplib.SMTP) -> None:
        if not client.is_connected:
            return
        with contextlib.suppress(aiosmtplib.SMTPException, OSError, TimeoutError):
            await client.quit(timeout=QUIT_WAIT_S)
        client.close()

    async def lookup(self, delivery: OutboundDelivery) -> LookupResult:
        """IMAP SEARCH by Message-ID in the archive mailbox; "unsupported" without one."""
        if self._lookup is None:
            return LookupResult(
                LookupOutcome.UNSUPPORTED,
                "the smtp channel has no archive mailbox (imap_host unset)",
            )
        domain = self._config.id_domain
        if domain is None:
            return LookupResult(
                LookupOutcome.LOOKUP_ERROR, "no Message-ID domain (from_address unset)"
            )
        return await self._lookup.find(message_id(delivery.idempotency_key, domain))


def adapter(build: AdapterBuild) -> SmtpChannel:
    """The smtp channel's adapter factory (its plugin: events/channels/builtin.py)."""
    config = build.config if isinstance(build.config, SmtpSettings) else SmtpSettings()
    deadline_s = build.deadline_s
    lookup = ArchiveLookup(config, deadline_s=deadline_s) if config.imap_host else None
    return SmtpChannel(config, deadline_s=deadline_s, lookup=lookup)
