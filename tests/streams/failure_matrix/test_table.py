"""The failure matrix as one table: (channel, row) pairs, one body per row.

Every row checks the ledger's final state AND what the provider holds: each logical event
accepted exactly once under its key (none for a refused one), how many writes carried the
key, and that the live projection shows the ledger's state (rebuilt equals live). A row's
channel-specific expectations (its error class, the provider's reason, a status sequence)
are the table's; how a channel is reached is its driver's (``drivers.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import pytest

from events.delivery import DeliveryEvent, DeliveryRetryScheduled
from events.delivery_state import Status
from events.outcomes import LookupOutcome
from tests.fixtures.broker import ReadTopic, all_deliveries
from tests.fixtures.worker import wait_for
from tests.streams.failure_matrix.drivers import (
    BrowserDriver,
    Driver,
    EmailApiDriver,
    Fault,
    ProviderDriver,
    SlackDriver,
    SmtpDriver,
    WebhookDriver,
)
from tests.streams.failure_matrix.stacks import Stack, StackPool


class Row(StrEnum):
    """The rows of the matrix that recur across channels."""

    TIMEOUT_AFTER_ACCEPT = "timeout_after_accept"  # -> UNKNOWN, the lookup confirms it
    RESET_AFTER_ACCEPT = "reset_after_accept"  # -> UNKNOWN, the lookup confirms it
    ERROR_AFTER_ACCEPT = "error_after_accept"  # 5xx after accepting: looked up, not resent
    NOT_TAKEN = "not_taken"  # timed out, not found twice by the lookup: sent again, once
    RATE_LIMITED = "rate_limited"  # refused for now: retried (after Retry-After)
    REJECTED = "rejected"  # refused for good: FAILED, nothing accepted, never retried
    BOUNCED = "bounced"  # accepted, then failed at the provider: FAILED with its reason
    KILLED_AFTER_SEND = "killed_after_send"  # worker killed: another worker's lookup settles
    KILLED_BEFORE_SEND = "killed_before_send"  # lease expires: not found twice, sent once
    FOREIGN_COPY = "foreign_copy"  # another sender's message with the key confirms nothing
    NO_LOOKUP_NO_DEDUPE = "no_lookup_no_dedupe"  # stays UNKNOWN for an operator
    DEDUPE_DECLARED = "dedupe_declared"  # no lookup, the receiver dedupes: retried safely


# Rows that kill a worker run on a stack of their own; the others share their channel's.
KILLS_A_WORKER = {Row.KILLED_AFTER_SEND, Row.KILLED_BEFORE_SEND, Row.FOREIGN_COPY}

ROW_FAULT = {
    Row.TIMEOUT_AFTER_ACCEPT: Fault.TIMEOUT_AFTER_ACCEPT,
    Row.RESET_AFTER_ACCEPT: Fault.RESET_AFTER_ACCEPT,
    Row.ERROR_AFTER_ACCEPT: Fault.ERROR_AFTER_ACCEPT,
    Row.NOT_TAKEN: Fault.NOT_TAKEN,
    Row.RATE_LIMITED: Fault.RATE_LIMITED,
    Row.REJECTED: Fault.REJECTED,
    Row.BOUNCED: Fault.BOUNCED,
}

# The stacks: a channel's driver with its fake's and its endpoint's configuration.
STACKS: dict[str, Callable[[], Driver]] = {
    "webhook": partial(WebhookDriver, "plain"),
    "webhook_kit": partial(WebhookDriver, "kit"),
    "webhook-delivered": partial(WebhookDriver, "plain", delivered_after_s=0),
    "webhook_kit-delivered": partial(WebhookDriver, "kit", delivered_after_s=0),
    "webhook-no_lookup": partial(WebhookDriver, "plain", lookup=False),
    "webhook_kit-no_lookup": partial(WebhookDriver, "kit", lookup=False),
    "webhook-dedupe": partial(
        WebhookDriver, "plain", dedupe=True, lookup=False, receiver_dedupes=True
    ),
    "webhook_kit-dedupe": partial(
        WebhookDriver, "kit", dedupe=True, lookup=False, receiver_dedupes=True
    ),
    "provider": ProviderDriver,
    "provider-delivered": partial(ProviderDriver, delivered_after_s=0),
    "slack": SlackDriver,
    "email_api": EmailApiDriver,
    # Delivered from its second lookup on: found "sent" by key, then polled until delivered.
    "email_api-reads": partial(EmailApiDriver, deliver_after_reads=2),
    # Gets by id only, but honours Idempotency-Key for 24 h, as declared.
    "email_api-dedupe": partial(EmailApiDriver, dedupe=True, lookup_by_key=False),
    "smtp": SmtpDriver,
    "smtp-no_lookup": partial(SmtpDriver, imap=False),
    "smtp-dedupe": partial(SmtpDriver, imap=False, receiver_dedupes_message_id=True),
    "browser": partial(BrowserDriver, "list"),
    "browser_search": partial(BrowserDriver, "search"),
}


@dataclass(frozen=True)
class Case:
    """One (channel, row) of the table and what that channel shows for it."""

    channel: str
    row: Row
    stack: str = ""  # STACKS entry (default: the channel's)
    fault: Fault | None = None  # the fault injected (default: the row's)
    error_class: str | None = None  # the state's last_error_class at the end
    reason: tuple[str, ...] = ()  # fragments of the state's last_reason
    statuses: tuple[int, ...] | None = None  # the writes' statuses, where the fake has them
    retry_after: bool = False  # the retry waited for Retry-After: 2
    # A first attempt may spend its lease launching Chromium (refused before the submit):
    # the provider's count of writes is then what proves nothing was sent twice.
    first_attempt_may_be_refused: bool = False
    provider_id_suffix: str | None = None
    # NO_LOOKUP_NO_DEDUPE: one delivery per entry, faulted or (None) clean.
    faults: tuple[Fault | None, ...] = ()
    final: Status = Status.CONFIRMED  # DEDUPE_DECLARED: where the retry ends
    copies_after_retry: int = 1  # DEDUPE_DECLARED: what a receiver without dedupe shows
    dedupe_rule: str = ""
    safety: str = ""

    @property
    def id(self) -> str:
        return f"{self.channel}-{self.row}"

    @property
    def stack_name(self) -> str:
        return self.stack or self.channel

    @property
    def injected(self) -> Fault:
        return self.fault or ROW_FAULT[self.row]


LOOKED_UP = ("lookup by idempotency key",)


def webhook_rows(channel: str) -> list[Case]:
    """The webhook rows, against a plain receiver or a receiver-kit app (``_kit``)."""
    return [
        Case(
            channel, Row.TIMEOUT_AFTER_ACCEPT, error_class="timeout_after_write", reason=LOOKED_UP
        ),
        Case(channel, Row.ERROR_AFTER_ACCEPT, error_class="http_5xx"),
        Case(channel, Row.RATE_LIMITED, retry_after=True),
        Case(channel, Row.REJECTED, error_class="http_4xx", reason=("410",)),
        Case(channel, Row.KILLED_AFTER_SEND, stack=f"{channel}-delivered"),
        Case(
            channel,
            Row.NO_LOOKUP_NO_DEDUPE,
            stack=f"{channel}-no_lookup",
            faults=(Fault.TIMEOUT_AFTER_ACCEPT, Fault.ERROR_AFTER_ACCEPT, Fault.NOT_TAKEN, None),
        ),
        Case(
            channel,
            Row.DEDUPE_DECLARED,
            stack=f"{channel}-dedupe",
            fault=Fault.ERROR_AFTER_ACCEPT,
            dedupe_rule="webhook-id",
            safety="receiver_dedupes=true",
        ),
    ]


TABLE: list[Case] = [
    *webhook_rows("webhook"),
    *webhook_rows("webhook_kit"),
    Case("provider", Row.NOT_TAKEN),
    Case("provider", Row.KILLED_AFTER_SEND, stack="provider-delivered"),
    Case("slack", Row.ERROR_AFTER_ACCEPT, error_class="http_5xx"),
    Case("slack", Row.TIMEOUT_AFTER_ACCEPT, error_class="timeout_after_write", reason=LOOKED_UP),
    Case("slack", Row.RATE_LIMITED, statuses=(429, 200), retry_after=True),
    Case("slack", Row.REJECTED, error_class="provider_rejected", reason=("channel_not_found",)),
    Case("slack", Row.KILLED_AFTER_SEND),
    Case("slack", Row.FOREIGN_COPY),
    Case("email_api", Row.ERROR_AFTER_ACCEPT, error_class="http_5xx", statuses=(500,)),
    Case("email_api", Row.RATE_LIMITED, statuses=(429, 200), retry_after=True),
    Case(
        "email_api",
        Row.REJECTED,
        error_class="http_4xx",
        reason=("validation_error: `to` is on the suppression list",),
        statuses=(422,),
    ),
    Case(
        "email_api",
        Row.BOUNCED,
        error_class="provider_failed",
        reason=("bounced", "550 5.1.1 user unknown"),
        statuses=(200,),
    ),
    Case(
        "email_api",
        Row.TIMEOUT_AFTER_ACCEPT,
        stack="email_api-reads",
        error_class="timeout_after_write",
        statuses=(200,),
    ),
    Case(
        "email_api",
        Row.DEDUPE_DECLARED,
        stack="email_api-dedupe",
        fault=Fault.TIMEOUT_AFTER_ACCEPT,
        dedupe_rule="idempotency-key-24h",
        safety="24 h",
    ),
    Case("smtp", Row.RESET_AFTER_ACCEPT, error_class="reset_after_write", reason=LOOKED_UP),
    Case("smtp", Row.RATE_LIMITED),  # 421 before DATA
    Case("smtp", Row.REJECTED, error_class="smtp_5xx", reason=("550",)),
    Case(
        "smtp",
        Row.NO_LOOKUP_NO_DEDUPE,
        stack="smtp-no_lookup",
        error_class="reset_after_write",
        faults=(Fault.RESET_AFTER_ACCEPT,),
    ),
    Case(
        "smtp",
        Row.DEDUPE_DECLARED,
        stack="smtp-dedupe",
        fault=Fault.RESET_AFTER_ACCEPT,
        final=Status.SENT,
        copies_after_retry=2,
        dedupe_rule="message-id",
        safety="receiver_dedupes_message_id=true",
    ),
    Case("smtp", Row.FOREIGN_COPY, provider_id_suffix="/2"),
    Case(
        "browser",
        Row.RESET_AFTER_ACCEPT,
        error_class="reset_after_write",
        first_attempt_may_be_refused=True,
    ),
    Case(
        "browser",
        Row.TIMEOUT_AFTER_ACCEPT,
        error_class="timeout_after_write",
        first_attempt_may_be_refused=True,
    ),
    Case("browser", Row.REJECTED, error_class="provider_rejected", reason=("#rejected",)),
    Case("browser", Row.KILLED_AFTER_SEND),
    Case("browser", Row.KILLED_BEFORE_SEND),
    Case(
        "browser_search",
        Row.RESET_AFTER_ACCEPT,
        error_class="reset_after_write",
        first_attempt_may_be_refused=True,
    ),
    Case("browser_search", Row.KILLED_BEFORE_SEND),
]


async def events_of(stack: Stack[Driver], read_topic: ReadTopic) -> list[DeliveryEvent]:
    events = await read_topic(stack.settings.kafka.topic_deliveries)
    assert all_deliveries(events)
    return list(events)


def check_state(case: Case, error_class: str | None, reason: str | None) -> None:
    assert error_class == case.error_class, (error_class, reason)
    for fragment in case.reason:
        assert fragment in (reason or ""), (fragment, reason)


def check_sends(case: Case, stack: Stack[Driver], key: str, count: int) -> None:
    sends = stack.driver.sends(key)
    assert len(sends) == count, sends
    if case.statuses is not None:
        assert tuple(s.status for s in sends) == case.statuses, sends


async def lost_answer(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """The provider accepted it and its answer was lost (late, cut, or a 5xx): UNKNOWN,
    and the lookup by key finds it; it is never sent again."""
    [key] = await stack.publish(case.id, (case.injected,))
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED by lookup")
    state = states[key]
    if not case.first_attempt_may_be_refused:
        assert state.attempt == 1, "an UNKNOWN must never be retried when the lookup finds it"
    check_state(case, state.last_error_class, state.last_reason)
    if (provider_id := stack.driver.accepted_once(key)) is not None:
        assert state.provider_message_id == provider_id
    assert stack.driver.copies(key) == 1
    check_sends(case, stack, key, 1)
    if case.row is not Row.ERROR_AFTER_ACCEPT:
        stack.driver.check_lookup(key, state, await events_of(stack, read_topic))
    await stack.matches()


async def not_taken(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """The provider sits on the request past the deadline and never takes it: sent again
    only after two "not found" answers, and accepted once."""
    [key] = await stack.publish(case.id, (Fault.NOT_TAKEN,))
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED on retry")
    state = states[key]
    assert state.attempt == 2
    assert state.provider_message_id
    assert state.provider_message_id == stack.driver.accepted_once(key)
    check_sends(case, stack, key, 2)
    assert stack.driver.not_found_answers(key) >= 2
    await stack.matches()


async def rate_limited(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """Refused for now: sent again (after Retry-After where given) and accepted once."""
    [key] = await stack.publish(case.id, (Fault.RATE_LIMITED,))
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED after the retry")
    assert states[key].attempt == 2
    if (provider_id := stack.driver.accepted_once(key)) is not None:
        assert states[key].provider_message_id == provider_id
    assert stack.driver.copies(key) == 1
    check_sends(case, stack, key, 2)
    if case.retry_after:
        first, second = stack.driver.sends(key)
        assert first.at is not None
        assert second.at is not None
        assert second.at - first.at >= 1.9  # Retry-After: 2 honoured
    await stack.matches()


async def refused(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """Refused for good (or bounced after acceptance): FAILED with the provider's reason,
    never sent again."""
    before = stack.driver.total()
    [key] = await stack.publish(case.id, (case.injected,))
    states = await stack.until([key], {Status.FAILED}, "FAILED")
    check_state(case, states[key].last_error_class, states[key].last_reason)
    accepted = 1 if case.row is Row.BOUNCED else 0  # a bounce comes after the acceptance
    assert stack.driver.ours(key) == accepted
    assert stack.driver.copies(key) == accepted
    assert stack.driver.total() == before + accepted
    check_sends(case, stack, key, 1)  # a permanent refusal is never retried
    await stack.matches()


async def killed_after_send(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """The worker is killed once the provider answered, before the outcome reached the log:
    the next worker's lookup settles it, nothing is sent twice."""
    [key] = await stack.publish(case.id)
    await stack.killed("worker.after_response")
    assert stack.driver.ours(key) == 1  # the provider had it when the worker died
    stack.workers.start("w1")
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED after the kill")
    if (provider_id := stack.driver.accepted_once(key)) is not None:
        assert states[key].provider_message_id == provider_id
    check_sends(case, stack, key, 1)  # nothing may be sent twice after the crash
    await stack.matches()


async def killed_before_send(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """Killed with the claim in the log and nothing sent: the lease expires into UNKNOWN,
    and only "not found" of OUR message (twice) lets the next worker send, once. With
    ``FOREIGN_COPY`` another sender's message carrying the key is there first; it is not
    our delivery and may not settle the UNKNOWN."""
    [key] = await stack.publish(case.id)
    await stack.killed("worker.before_send")
    assert stack.driver.copies(key) == 0
    assert stack.driver.sends(key) == []
    others = 0
    forged = None
    if case.row is Row.FOREIGN_COPY:
        forged = await stack.driver.forge(key)
        others = 1
    stack.workers.start("w1")
    states = await stack.until([key], {Status.CONFIRMED}, "CONFIRMED by our send")
    state = states[key]
    assert state.attempt >= 2, "only a lookup's 'not found' twice may let it send again"
    if (provider_id := stack.driver.accepted_once(key)) is not None:
        assert state.provider_message_id == provider_id
    if forged is not None:
        assert state.provider_message_id != forged
    if case.provider_id_suffix is not None:
        assert (state.provider_message_id or "").endswith(case.provider_id_suffix), state
    assert stack.driver.copies(key) == 1 + others  # the other sender's, untouched
    check_sends(case, stack, key, 1 + others)
    await stack.matches()


async def no_lookup_no_dedupe(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """Without a lookup or a declared dedupe, an UNKNOWN stays UNKNOWN for an operator:
    the lookup answers "unsupported" and nothing is sent again; a clean one confirms."""
    keys = await stack.publish(case.id, case.faults)
    faulted = [k for k, fault in zip(keys, case.faults, strict=True) if fault is not None]
    clean = [k for k, fault in zip(keys, case.faults, strict=True) if fault is None]
    await stack.until(clean, {Status.CONFIRMED}, "the clean ones CONFIRMED")

    async def unresolved() -> bool:
        states = await stack.view()
        return all(
            states[k].status is Status.UNKNOWN and states[k].reconciled is LookupOutcome.UNSUPPORTED
            for k in faulted
        )

    await wait_for(unresolved, 60, "UNKNOWN with no lookup to settle it")
    await asyncio.sleep(3)  # past another settle window and spacing: nothing more happens
    states = await stack.view()
    for key, fault in zip(keys, case.faults, strict=True):
        if fault is None:
            assert stack.driver.ours(key) == 1
            continue
        assert states[key].status is Status.UNKNOWN
        assert states[key].attempt == 1
        if case.error_class is not None:
            assert states[key].last_error_class == case.error_class
        assert len(stack.driver.sends(key)) == 1, "an UNKNOWN without lookup or dedupe stays"
        assert stack.driver.ours(key) == int(fault.accepts)
        assert stack.driver.copies(key) == int(fault.accepts)
    await stack.matches()


async def dedupe_declared(case: Case, stack: Stack[Driver], read_topic: ReadTopic) -> None:
    """No lookup, but the endpoint declares the receiver dedupes: the UNKNOWN is sent again
    under the declared rule, named in the retry event."""
    [key] = await stack.publish(case.id, (case.injected,))
    states = await stack.until([key], {case.final}, f"{case.final.value} after the retry")
    assert states[key].attempt == 2
    check_sends(case, stack, key, 2)  # the retry reached the provider
    assert stack.driver.copies(key) == case.copies_after_retry
    if case.copies_after_retry == 1:  # which deduped it
        if (provider_id := stack.driver.accepted_once(key)) is not None:
            assert states[key].provider_message_id == provider_id
    else:
        assert stack.driver.ours(key) == case.copies_after_retry
        stack.driver.check_resent(key)
    events = await events_of(stack, read_topic)
    [retry] = [
        e for e in events if isinstance(e, DeliveryRetryScheduled) and e.idempotency_key == key
    ]
    assert retry.dedupe_rule == case.dedupe_rule  # the channel's rule, named in the event
    assert case.safety in retry.safety
    await stack.matches()


Body = Callable[[Case, Stack[Driver], ReadTopic], Awaitable[None]]
BODIES: dict[Row, Body] = {
    Row.TIMEOUT_AFTER_ACCEPT: lost_answer,
    Row.RESET_AFTER_ACCEPT: lost_answer,
    Row.ERROR_AFTER_ACCEPT: lost_answer,
    Row.NOT_TAKEN: not_taken,
    Row.RATE_LIMITED: rate_limited,
    Row.REJECTED: refused,
    Row.BOUNCED: refused,
    Row.KILLED_AFTER_SEND: killed_after_send,
    Row.KILLED_BEFORE_SEND: killed_before_send,
    Row.FOREIGN_COPY: killed_before_send,
    Row.NO_LOOKUP_NO_DEDUPE: no_lookup_no_dedupe,
    Row.DEDUPE_DECLARED: dedupe_declared,
}


def table() -> list[Any]:
    """The cases; the rows that share a stack carry its name as their xdist group, so
    ``scripts/test`` deals them to one process, where the stack is built once."""
    return [
        pytest.param(case, id=case.id)
        if case.row in KILLS_A_WORKER
        else pytest.param(case, id=case.id, marks=pytest.mark.xdist_group(case.stack_name))
        for case in TABLE
    ]


@pytest.mark.parametrize("case", table())
async def test_failure_matrix(case: Case, stack_pool: StackPool, read_topic: ReadTopic) -> None:
    shared = case.row not in KILLS_A_WORKER
    stack = await stack_pool.get(
        case.stack_name, STACKS[case.stack_name], read_topic, shared=shared
    )
    try:
        await BODIES[case.row](case, stack, read_topic)
    finally:
        stack_pool.release()
