"""One driver per channel of the failure matrix: how the rows reach a channel's fake.

A driver starts its fake provider, points settings at it, builds a delivery, injects a
fault by its generic name, and counts what the provider accepted per key (none of the fakes
dedupes unless the driver was made to). The rows' bodies (``test_table.py``) speak only
this vocabulary, so a row is written once for every channel it applies to.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from email.message import EmailMessage
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

import aiosmtplib
from pydantic import JsonValue, Secret, SecretStr
from slack_sdk.web.async_client import AsyncWebClient

from clients import DeliverySpec
from config.settings import Settings, changed
from events.delivery import DeliveryEvent, DeliveryReconciled, DeliveryUnknown
from events.delivery_state import DeliveryState
from events.keys import idempotency_key
from events.outcomes import LookupOutcome
from events.retry_policy import RetryPolicy
from ledger.simulator import SimulatorConfig
from ledger.simulator.background import BackgroundSimulator
from ledger.simulator.email_api import FakeEmailApiConfig
from ledger.simulator.form import FakeForm, FakeFormConfig
from ledger.simulator.mail import Dovecot, MailServer, MailStack
from ledger.simulator.slack import BOT_ID
from streams.channels.mail_origin import ORIGIN_HEADER, sealed_by_us
from streams.channels.slack import METADATA_EVENT_TYPE
from streams.channels.smtp import message_id
from tests.fixtures.email_api import API_KEY, RECIPIENT, BackgroundFakeEmailApi
from tests.fixtures.form import TARGET, BackgroundFakeForm, form_target
from tests.fixtures.mail import DOMAIN, ORIGIN_KEY
from tests.fixtures.receiver import signing_secret
from tests.fixtures.slack import CHANNEL, OTHER_APP, OTHER_TOKEN, WORKSPACE, start_fake_slack

# An answer held this long is past the workers' deadline (1.5 s; the browser's 5 s below).
LATE_S = 4.0
# Chromium needs more than the HTTP rows' 1.5 s on a busy machine, and the lease must also
# cover its first launch and the page before the submit (the lease rule checks there).
BROWSER_DEADLINE_S = 5.0


class Fault(StrEnum):
    """A provider fault by its generic name; each driver says what it is at its fake."""

    TIMEOUT_AFTER_ACCEPT = "timeout_after_accept"  # accepted, answered past the deadline
    RESET_AFTER_ACCEPT = "reset_after_accept"  # accepted, the connection dies before the answer
    ERROR_AFTER_ACCEPT = "error_after_accept"  # accepted, answered 5xx
    RATE_LIMITED = "rate_limited"  # refused for now (429 with Retry-After, SMTP 421)
    REJECTED = "rejected"  # refused for good
    BOUNCED = "bounced"  # accepted, then failed at the provider
    NOT_TAKEN = "not_taken"  # held past the deadline, then refused: nothing accepted

    @property
    def accepts(self) -> bool:
        """Whether the provider holds the message once this fault has played."""
        return self in {
            Fault.TIMEOUT_AFTER_ACCEPT,
            Fault.RESET_AFTER_ACCEPT,
            Fault.ERROR_AFTER_ACCEPT,
            Fault.BOUNCED,
        }


@dataclass(frozen=True)
class Send:
    """One write that carried a key, as the provider saw it (time and status if known)."""

    at: float | None = None
    status: int | None = None


class Driver:
    """A channel's fake provider, started when the driver is made, and how the matrix
    talks to it (subclasses fill it in)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        # The recipient each published key went to (faults and counts of some fakes go by it).
        self.recipients: dict[str, str] = {}

    def stop(self) -> None:
        """Stop the fake."""

    def point(self, settings: Settings) -> Settings:
        """``settings`` with this channel pointed at the fake."""
        raise NotImplementedError

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        """Delivery ``n`` of run ``run_id`` on this channel."""
        raise NotImplementedError

    def key(self, run_id: str, spec: DeliverySpec) -> str:
        """The idempotency key the publisher will give ``spec`` (faults are armed first)."""
        key = idempotency_key(run_id, spec.event_type, spec.channel, spec.recipient)
        self.recipients[key] = spec.recipient
        return key

    # Each generic fault this channel has: its fake's fault kind and fields.
    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {}

    def inject(self, key: str, fault: Fault) -> None:
        """Arm ``fault`` for the next write carrying ``key``."""
        if fault not in self.faults:
            raise NotImplementedError(f"{self.channel}: {fault}")
        kind, fields = self.faults[fault]
        self.arm(key, kind, fields)

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        """Arm the fake's fault ``kind`` with ``fields`` for ``key``."""
        raise NotImplementedError

    def ours(self, key: str) -> int:
        """Messages the provider accepted from the ledger under ``key``."""
        raise NotImplementedError

    def copies(self, key: str) -> int:
        """Messages the provider holds that carry ``key`` (ours and anyone else's)."""
        return self.ours(key)

    def sends(self, key: str) -> list[Send]:
        """The writes that carried ``key`` (answered or not)."""
        raise NotImplementedError

    def total(self) -> int:
        """Everything the provider has accepted so far, from anyone."""
        raise NotImplementedError

    def accepted_once(self, key: str) -> str | None:
        """Exactly one of ours carries ``key``; the provider's id for it (None where the
        ledger's id for it is not the fake's)."""
        assert self.ours(key) == 1, (key, self.ours(key))
        return None

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        """The lookup by key settled ``state``: the channel's evidence of it."""

    def check_resent(self, key: str) -> None:
        """What a declared-safe resend left at the provider (where it shows)."""

    def not_found_answers(self, key: str) -> int:
        """Lookups of ``key`` the provider answered "not found"."""
        raise NotImplementedError(self.channel)

    async def forge(self, key: str) -> str | None:
        """Another sender's message carrying ``key``; the id the ledger would give it."""
        raise NotImplementedError(self.channel)


class WebhookDriver(Driver):
    """Standard Webhooks at the simulator, its receiver plain or a receiver-kit app;
    ``lookup`` and ``receiver_dedupes`` are what the endpoint declares."""

    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {
        Fault.TIMEOUT_AFTER_ACCEPT: ("delay", {"delay_s": LATE_S}),
        Fault.ERROR_AFTER_ACCEPT: ("error_after_accept", {"status": 500}),
        Fault.RATE_LIMITED: ("rate_limit", {"retry_after": "2"}),
        Fault.REJECTED: ("reject", {"status": 410}),
        Fault.NOT_TAKEN: ("stall", {"delay_s": LATE_S, "status": 503}),
    }

    def __init__(
        self,
        hooks: Literal["plain", "kit"] = "plain",
        *,
        dedupe: bool = False,
        delivered_after_s: float | None = 0.5,
        lookup: bool = True,
        receiver_dedupes: bool = False,
        channel: str = "webhook",
    ) -> None:
        super().__init__(channel)
        self.lookup, self.receiver_dedupes = lookup, receiver_dedupes
        config = SimulatorConfig(
            hooks=hooks,
            dedupe=dedupe,
            delivered_after_s=delivered_after_s,
            webhook_secret=signing_secret(),
        )
        self.receiver = BackgroundSimulator(config).start()

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        self.receiver.fault(kind, key=key, **fields)

    def stop(self) -> None:
        self.receiver.stop()

    def point(self, settings: Settings) -> Settings:
        return self.receiver.settings(
            settings, lookup=self.lookup, receiver_dedupes=self.receiver_dedupes
        )

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        url = self.receiver.webhook_url(f"{run_id}-{n}")
        return DeliverySpec(channel="webhook", recipient=url, payload={"n": n})

    def ours(self, key: str) -> int:
        return self.receiver.accepted(key)

    def sends(self, key: str) -> list[Send]:
        return [Send(r.at, r.status) for r in self.receiver.requests(key=key, method="POST")]

    def total(self) -> int:
        return len(self.receiver.events())

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        assert len(self.receiver.requests(key=key, method="GET")) >= 1

    def not_found_answers(self, key: str) -> int:
        return len([r for r in self.receiver.requests(key=key, method="GET") if r.status == 404])


class ProviderDriver(WebhookDriver):
    """The simulator's provider API (the ``provider`` channel): ids, status by lookup."""

    def __init__(self, *, delivered_after_s: float | None = 0.5) -> None:
        super().__init__(delivered_after_s=delivered_after_s, channel="provider")

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        return DeliverySpec(
            channel="provider", recipient=self.receiver.provider_url, payload={"to": f"{n}"}
        )

    def accepted_once(self, key: str) -> str | None:
        super().accepted_once(key)
        event = self.receiver.event(key)
        assert event is not None
        return event.receiver_id


class SlackDriver(Driver):
    """The fake Slack Web API: a post is a message in the conversation's history."""

    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {
        Fault.TIMEOUT_AFTER_ACCEPT: ("timeout_after_post", {"delay_s": LATE_S}),
        Fault.ERROR_AFTER_ACCEPT: ("error_after_post", {"status": 500}),
        Fault.RATE_LIMITED: ("ratelimited", {"retry_after": 2}),
        Fault.REJECTED: ("error", {"error": "channel_not_found"}),
    }

    def __init__(self) -> None:
        super().__init__("slack")
        self.slack = start_fake_slack()

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        self.slack.fake.fault(kind, key=key, **fields)

    def stop(self) -> None:
        self.slack.stop()

    def point(self, settings: Settings) -> Settings:
        return self.slack.settings(settings)

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        payload = {"text": f"{run_id} is ready ({n})"}
        return DeliverySpec(channel="slack", recipient=self.slack.recipient(), payload=payload)

    def ours(self, key: str) -> int:
        return len(self.slack.fake.messages(key, bot_id=BOT_ID))

    def copies(self, key: str) -> int:
        return len(self.slack.fake.messages(key))

    def sends(self, key: str) -> list[Send]:
        return [Send(c.at, c.status) for c in self.slack.fake.calls("chat.postMessage", key)]

    def total(self) -> int:
        return len(self.slack.fake.messages())

    def accepted_once(self, key: str) -> str | None:
        """Exactly one message our bot posted carries ``key`` (another app's message with
        the key is not a delivery of ours), once in the conversation's history."""
        [message] = self.slack.fake.messages(key, bot_id=BOT_ID)
        history = self.slack.fake.history(WORKSPACE, CHANNEL)
        assert [(m.key, m.bot_id) for m in history].count((key, BOT_ID)) == 1
        return f"{CHANNEL}/{message.ts}"

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        assert self.slack.fake.calls("conversations.history")

    async def forge(self, key: str) -> str | None:
        """Another app in the conversation posts a message carrying the key's metadata (the
        official SDK, with its own bot token)."""
        other = AsyncWebClient(token=OTHER_TOKEN, base_url=self.slack.api_url)
        metadata = {"event_type": METADATA_EVENT_TYPE, "event_payload": {"idempotency_key": key}}
        forged = await other.chat_postMessage(channel=CHANNEL, text="forged", metadata=metadata)
        assert [m.bot_id for m in self.slack.fake.messages(key)] == [OTHER_APP.bot_id]
        return f"{CHANNEL}/{forged['ts']}"


class EmailApiDriver(Driver):
    """The fake email API: a request is an email in its list; lookup by key, poll by id."""

    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {
        Fault.TIMEOUT_AFTER_ACCEPT: ("timeout_after_accept", {"delay_s": LATE_S}),
        Fault.ERROR_AFTER_ACCEPT: ("error_after_accept", {"status": 500}),
        Fault.RATE_LIMITED: ("ratelimited", {"retry_after": 2}),
        Fault.REJECTED: ("reject", {"message": "`to` is on the suppression list"}),
        Fault.BOUNCED: ("bounce", {"reason": "550 5.1.1 user unknown"}),
    }

    def __init__(
        self,
        *,
        deliver_after_reads: int | None = None,
        dedupe: bool = False,
        lookup_by_key: bool = True,
    ) -> None:
        super().__init__("email_api")
        self.deliver_after_reads, self.lookup_by_key = deliver_after_reads, lookup_by_key
        config = FakeEmailApiConfig(
            api_keys=[API_KEY],
            deliver_after_reads=deliver_after_reads,
            dedupe=dedupe,
            lookup_by_key=lookup_by_key,
        )
        self.api = BackgroundFakeEmailApi(config).start()

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        self.api.fake.fault(kind, key=key, **fields)

    def stop(self) -> None:
        self.api.stop()

    def point(self, settings: Settings) -> Settings:
        # A provider without the lookup by key declares its 24 h Idempotency-Key rule.
        declared: dict[str, JsonValue] = (
            {} if self.lookup_by_key else {"lookup_by_key": False, "provider_dedupes": True}
        )
        return self.api.settings(settings, **declared)

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        payload = {"subject": f"{run_id} is ready ({n})", "text": "The report is ready."}
        return DeliverySpec(channel="email_api", recipient=RECIPIENT, payload=payload)

    def ours(self, key: str) -> int:
        return len(self.api.fake.messages(key))

    def sends(self, key: str) -> list[Send]:
        return [Send(c.at, c.status) for c in self.api.fake.calls("POST", key)]

    def total(self) -> int:
        return len(self.api.fake.messages())

    def accepted_once(self, key: str) -> str | None:
        [message] = self.api.fake.messages(key)
        assert message.to == [RECIPIENT]
        return message.id

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        """UNKNOWN, found by key (-> SENT), polled by id until delivered."""
        mine = [e for e in events if e.idempotency_key == key]
        unknown = next(i for i, e in enumerate(mine) if isinstance(e, DeliveryUnknown))
        assert all(not isinstance(e, DeliveryReconciled) for e in mine[:unknown])
        reconciled = [e for e in mine if isinstance(e, DeliveryReconciled)]
        assert reconciled[0].evidence.startswith(f"GET {self.api.api_url}/emails -> 200")
        if self.deliver_after_reads == 2:  # delivered from the second lookup on
            assert [r.provider_status for r in reconciled] == ["sent", "delivered"]
        assert f"/emails/{state.provider_message_id} -> 200" in reconciled[-1].evidence
        assert reconciled[-1].provider_status == "delivered"
        assert any(c.path == "/emails" for c in self.api.fake.calls("GET"))


class SmtpDriver(Driver):
    """aiosmtpd delivering into a Maildir (a second message with one Message-ID is a second
    file) plus an archive copy that dovecot serves over IMAP (the lookup, unless ``imap``
    is off)."""

    # The server's faults go by recipient (a delivery has one of its own here).
    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {
        Fault.RESET_AFTER_ACCEPT: ("drop_after_data", {}),
        Fault.RATE_LIMITED: ("reply_421", {}),
        Fault.REJECTED: ("reply_550", {}),
    }

    def __init__(self, *, imap: bool = True, receiver_dedupes_message_id: bool = False) -> None:
        super().__init__("smtp")
        self.imap, self.receiver_dedupes_message_id = imap, receiver_dedupes_message_id
        self.root = Path(tempfile.mkdtemp(prefix="ledger-mail-", dir="/tmp"))
        self.root.chmod(0o755)
        smtp = MailServer(self.root).start()
        try:
            dovecot = Dovecot(smtp.archive_dir).start()  # scripts/dovecot installs it
        except BaseException:
            smtp.stop()
            raise
        self.mail = MailStack(smtp, dovecot)

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        self.mail.smtp.fault(self.recipients[key], kind, **fields)

    def stop(self) -> None:
        if self.mail.imap is not None:
            self.mail.imap.stop()
        self.mail.smtp.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def point(self, settings: Settings) -> Settings:
        overrides: dict[str, object] = {}
        if not self.imap:
            overrides.update(imap_host=None, imap_port=None)
        if self.receiver_dedupes_message_id:
            overrides["receiver_dedupes_message_id"] = True
        # The smtp default waits a minute after a 4xx (greylisting); a test cannot.
        fast = RetryPolicy(base_delay_s=0.5, max_delay_s=2.0)
        policies = {**settings.channels.retry_policies, "smtp": fast}
        pointed = self.mail.settings(settings, **overrides)
        return changed(pointed, {"channels.retry_policies": policies})

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        # A recipient per delivery: the server's faults and counts go by recipient.
        to = f"ops+{run_id}-{n}@example.org"
        return DeliverySpec(channel="smtp", recipient=to, payload={"text": f"{run_id} is ready"})

    def ours(self, key: str) -> int:
        """Messages with this key's Message-ID whose X-Ledger-Origin verifies."""
        mid = message_id(key, DOMAIN)
        return len(
            [
                m
                for m in self.mail.smtp.messages(mid)
                if sealed_by_us(SecretStr(ORIGIN_KEY), mid, m.get_all(ORIGIN_HEADER) or [])
            ]
        )

    def copies(self, key: str) -> int:
        return len(self.mail.smtp.messages(message_id(key, DOMAIN)))

    def sends(self, key: str) -> list[Send]:
        return [Send()] * self.mail.smtp.transactions(self.recipients[key])

    def total(self) -> int:
        return len(self.mail.smtp.messages())

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        assert (state.provider_message_id or "").startswith("INBOX/"), state.provider_message_id

    def check_resent(self, key: str) -> None:
        """The server does not dedupe, so the retry shows: two copies, one Message-ID. A
        receiver that keeps the declared promise would have kept one."""
        mid = message_id(key, DOMAIN)
        both = self.mail.smtp.messages(mid)
        assert [m["Message-ID"] for m in both] == [mid, mid]
        assert [m["Idempotency-Key"] for m in both] == [key, key]
        assert sorted(m["Fencing-Token"] for m in both) == ["1", "2"]

    async def forge(self, key: str) -> str | None:
        """Someone else mails our Message-ID through the relay, which files it in the
        archive like everything it accepts (as its first message: IMAP uid 1)."""
        other = EmailMessage()
        other["From"], other["To"], other["Subject"] = (
            "mallory@example.net",
            self.recipients[key],
            "not ours",
        )
        other["Message-ID"] = message_id(key, DOMAIN)
        other["Idempotency-Key"] = key
        other.set_content("forged")
        await aiosmtplib.send(other, hostname="127.0.0.1", port=self.mail.smtp.port)
        return None


Lookup = Literal["list", "search"]


class BrowserDriver(Driver):
    """Debian's Chromium filling the fake form (target ``tickets``); the target's lookup is
    its JSON list or its search page read in Chromium."""

    faults: ClassVar[dict[Fault, tuple[str, dict[str, Any]]]] = {
        # Accepted, then the connection dies mid-answer.
        Fault.RESET_AFTER_ACCEPT: ("crash", {}),
        Fault.TIMEOUT_AFTER_ACCEPT: ("slow", {"delay_s": BROWSER_DEADLINE_S + 3}),
        Fault.REJECTED: ("reject", {"reason": "duplicate title"}),
    }

    def __init__(self, lookup: Lookup = "list") -> None:
        super().__init__("browser")
        self.lookup: Lookup = lookup
        self.form = BackgroundFakeForm(FakeFormConfig()).start()
        self.app: FakeForm = self.form.app
        # The form counts submissions, not per key: a row's writes are those since its key.
        self.posts_before = 0

    def arm(self, key: str, kind: str, fields: dict[str, Any]) -> None:
        self.app.fault(kind, key=key, **fields)

    def stop(self) -> None:
        self.form.stop()

    def point(self, settings: Settings) -> Settings:
        config = Secret[dict[str, JsonValue]](
            {"targets": {TARGET: form_target(self.app.url, lookup=self.lookup)}}
        )
        return changed(
            settings,
            {
                "channels.settings": {"browser": config},
                "channels.allowed_networks": ["127.0.0.0/8"],
                "channels.send_deadline_s": BROWSER_DEADLINE_S,
                "worker.lease_s": 12.0,
            },
        )

    def spec(self, run_id: str, n: int = 0) -> DeliverySpec:
        payload = {"title": f"{run_id} failed ({n})", "body": "x"}
        return DeliverySpec(channel="browser", recipient=TARGET, payload=payload)

    def key(self, run_id: str, spec: DeliverySpec) -> str:
        self.posts_before = self.app.posts
        return super().key(run_id, spec)

    def ours(self, key: str) -> int:
        return len(self.app.accepted(key))

    def sends(self, key: str) -> list[Send]:
        return [Send()] * (self.app.posts - self.posts_before)

    def total(self) -> int:
        return len(self.app.accepted())

    def accepted_once(self, key: str) -> str | None:
        [submission] = self.app.accepted(key)
        return submission.id

    def check_lookup(self, key: str, state: DeliveryState, events: list[DeliveryEvent]) -> None:
        assert state.reconciled is LookupOutcome.FOUND, state.reconciled
