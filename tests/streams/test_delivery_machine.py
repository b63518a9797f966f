"""A hypothesis state machine over the worker's core: decisions + the fold, with a receiver.

It draws send results and lookup answers consistent with a receiver that does NOT dedupe
(a lookup tells the truth about what it accepted), timer ticks at drawn times, outcomes
that land late (after newer claims: a stale attempt's), and redelivered events. After
every step it checks the invariants the ledger promises; the receiver's count is the one
that matters: never more than one acceptance per logical event.

Run with ``--hypothesis-show-statistics`` to see which states and transitions it reached.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from config.settings import Settings
from events.base import Event
from events.delivery import DeliveryClaimed, DeliveryConfirmed, DeliveryEvent
from events.delivery_state import DeliveryState, Status, apply
from events.outcomes import NOT_FOUND_REQUIRED, ErrorClass, LookupOutcome
from streams.channels.base import LookupResult, SendOutcome, SendResult
from streams.decisions import after_lookup, after_send, on_timer
from tests.fixtures.core import T0, core_context, requested
from tests.fixtures.folds import projection_fold

# Three attempts at most, so histories of 50 steps reach the end of the retry policy.
CTX = core_context(
    settle_s=15.0,
    settings=Settings(
        worker={"claim_grace_s": 2.0}, channels={"retry_policies": {"webhook": {"max_attempts": 3}}}
    ),
)

# What one send does at the receiver, and what the sender learns: (accepted, result).
# "later": the receiver read the request and finishes processing it after the client gave
# up, a little after the settle window (the margin the repeated "not found" stands for).
SEND_EFFECTS = [
    ("no", SendResult(SendOutcome.NOT_SENT, "refused", ErrorClass.CONNECT_REFUSED)),
    ("no", SendResult(SendOutcome.NOT_SENT, "lease rule", ErrorClass.FENCED)),
    ("yes", SendResult(SendOutcome.CONFIRMED, "200", http_status=200)),
    ("yes", SendResult(SendOutcome.UNKNOWN, "timeout", ErrorClass.TIMEOUT_AFTER_WRITE)),
    ("yes", SendResult(SendOutcome.TRANSIENT, "500", ErrorClass.HTTP_5XX, 500)),
    ("later", SendResult(SendOutcome.UNKNOWN, "timeout", ErrorClass.TIMEOUT_AFTER_WRITE)),
    ("no", SendResult(SendOutcome.UNKNOWN, "timeout", ErrorClass.TIMEOUT_AFTER_WRITE)),
    ("no", SendResult(SendOutcome.TRANSIENT, "503", ErrorClass.HTTP_5XX, 503)),
    ("no", SendResult(SendOutcome.TRANSIENT, "429", ErrorClass.HTTP_429, 429)),
    ("no", SendResult(SendOutcome.REJECTED, "410", ErrorClass.HTTP_4XX, 410)),
]
# Lookup answers that say nothing about acceptance, and "failed" (what a provider says of
# a message it gave up on: answered only while the receiver has nothing).
NOISE: list[LookupOutcome | None] = [
    *[None] * 6,
    LookupOutcome.PROCESSING,
    LookupOutcome.LOOKUP_ERROR,
    LookupOutcome.FAILED,
]


class DeliveryMachine(RuleBasedStateMachine):
    """One logical delivery, one worker's decisions, one receiver."""

    def __init__(self) -> None:
        super().__init__()
        request = requested(0)
        self.now = T0
        self.log: list[Event] = [request]
        self.landed: list[Event] = [request]  # as read, redeliveries included
        self.max_token = 0
        self.transitions: set[tuple[Status, Status]] = set()
        self.stale = 0
        self.after_terminal = 0  # events that landed on CONFIRMED/FAILED
        self.not_found_while_processing = 0  # the answer a slow receiver gives too early
        first = apply(None, request)
        assert first is not None
        self.state: DeliveryState = first
        self.history: list[DeliveryState] = [first]
        self.pending: list[Event] = []
        self.sent_tokens: set[int] = set()
        self.accepted = 0
        self.processing_until: list[datetime] = []  # receiver deadlines of slow acceptances

    # -- what happens ---------------------------------------------------------------------

    @rule(
        seconds=st.sampled_from([3.0, 6.0, 16.0, 40.0]),
        noise=st.sampled_from(NOISE),
    )
    def tick(self, seconds: float, noise: LookupOutcome | None) -> None:
        """Time passes; a due timer proposes its decision or makes its lookup."""
        self.now += timedelta(seconds=seconds)
        self.finish_processing(everything_due=True)
        events, action = on_timer(self.state, self.now, CTX)
        self.propose(events)
        if action == "lookup":
            self.lookup(noise)

    def receiver_finishes(self) -> None:
        """A slow receiver finishes processing a request the client gave up on."""
        self.processing_until.pop(0)
        self.accepted += 1
        event("receiver finished a slow request")

    def finish_processing(self, *, everything_due: bool) -> None:
        while everything_due and self.processing_until and self.processing_until[0] <= self.now:
            self.receiver_finishes()

    @precondition(
        lambda self: (
            self.state.status is Status.CLAIMED and self.state.fencing_token not in self.sent_tokens
        )
    )
    @rule(
        effect=st.sampled_from(["no", "yes", "later"]).flatmap(
            lambda how: st.sampled_from([e for e in SEND_EFFECTS if e[0] == how])
        )
    )
    def send(self, effect: tuple[str, SendResult]) -> None:
        """The claim's holder sends (once per token); the receiver may accept it."""
        accepted, result = effect
        self.sent_tokens.add(self.state.fencing_token)
        if accepted == "yes":
            self.accepted += 1
        elif accepted == "later":
            # Slower than the settle window, within one spacing more: the second "not
            # found" is what protects against it.
            settle = CTX.settle_s(self.state.channel, self.state.recipient)
            slow = settle + CTX.lookup_confirm_spacing_s / 2
            self.processing_until.append(self.now + timedelta(seconds=slow))
        event(f"send: {result.outcome} (accepted: {accepted})")
        self.propose(after_send(self.state, self.state.fencing_token, result, self.now, CTX))

    def lookup(self, noise: LookupOutcome | None) -> None:
        """A lookup answers the truth as the receiver knows it now (a slow request that is
        still being processed is not found by a receiver that records only at the end)."""
        if noise == "failed" and not self.accepted and not self.processing_until:
            result = LookupResult(LookupOutcome.FAILED, "status failed", provider_status="failed")
        elif noise is not None and noise != "failed":
            result = LookupResult(noise, noise)
        elif self.accepted:
            result = LookupResult(LookupOutcome.FOUND, "200 done", "id-1", "done", delivered=True)
        else:
            result = LookupResult(LookupOutcome.NOT_FOUND, "404")
        event(f"lookup: {result.outcome} in {self.state.status}")
        if result.outcome == "not_found" and self.processing_until:
            self.not_found_while_processing += 1
        self.propose(after_lookup(self.state, result, self.now, CTX))

    def propose(self, events: list[Event]) -> None:
        """The decisions propose only what the fold accepts from the state they saw (in
        order): a proposal the fold refuses would be proposed again and again, and the
        delivery would never move (a liveness hole no safety check sees)."""
        state = self.state
        for proposed in events:
            after = apply(state, proposed)
            assert after is not None
            assert after != replace_seen(state, after), (
                f"proposed {type(proposed).__name__} does not apply in {state.status}"
            )
            state = after
        self.pending.extend(events)

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def land(self, data: st.DataObject) -> None:
        """One proposed event reaches the log (appends from different producers interleave)."""
        index = data.draw(st.integers(0, len(self.pending) - 1))
        self._fold(self.pending.pop(index))

    def status(self) -> Status:
        """The delivery's status now (a step replaces ``state``; read it afresh)."""
        return self.state.status

    @precondition(lambda self: bool(self.pending))
    @rule()
    def flush(self) -> None:
        """Everything proposed reaches the log, in order."""
        while self.pending:
            self._fold(self.pending.pop(0))

    @precondition(lambda self: len(self.log) > 1)
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """At-least-once: an event already in the log is read again."""
        self._fold(data.draw(st.sampled_from(self.log)), again=True)

    def _fold(self, landed: Event, *, again: bool = False) -> None:
        before = self.state
        after = apply(before, landed)
        assert after is not None
        if not again:
            self.log.append(landed)
        self.landed.append(landed)
        token = getattr(landed, "fencing_token", before.fencing_token)
        if token < before.fencing_token and not isinstance(landed, DeliveryConfirmed):
            assert after == replace_seen(before, after), "a stale attempt's outcome moved the state"
        if before.status.terminal and not again:
            self.after_terminal += 1
        if isinstance(landed, DeliveryClaimed) and after != replace_seen(before, after):
            self.check_claim(before, after)
        if after.status is not before.status:
            event(f"{before.status} -> {after.status}")
            self.transitions.add((before.status, after.status))
        elif not again and token < before.fencing_token:
            event(f"stale {type(landed).__name__} ignored")
            self.stale += 1
        if again:
            assert after == replace_seen(before, after), "a redelivered event changed the state"
        self.history.append(after)
        self.check_transition(before, after)
        self.state = after

    # -- what must hold -------------------------------------------------------------------

    def check_claim(self, before: DeliveryState, after: DeliveryState) -> None:
        """A claim the fold took: only when no attempt is live, under a never-used token."""
        assert before.status in (Status.PENDING, Status.RETRY_SCHEDULED), (
            f"a second live claim (claimed out of {before.status})"
        )
        assert after.fencing_token > self.max_token, "a claim under a used token"
        self.max_token = after.fencing_token
        event("a new claim under a new token")

    def check_transition(self, before: DeliveryState, after: DeliveryState) -> None:
        assert after.fencing_token >= before.fencing_token, "fencing tokens only grow"
        if before.status is Status.CONFIRMED:
            assert after.status is Status.CONFIRMED, "CONFIRMED is final"
        if before.status is Status.FAILED:
            assert after.status in (Status.FAILED, Status.CONFIRMED), "FAILED yields only to proof"
        if before.status is Status.UNKNOWN and after.status in (
            Status.RETRY_SCHEDULED,
            Status.FAILED,
        ):
            evidence = (
                before.reconciled == "not_found" and before.not_found >= NOT_FOUND_REQUIRED
            ) or before.reconciled in ("unsupported", "failed")
            assert evidence, f"left UNKNOWN without evidence ({before.reconciled})"
            event(f"UNKNOWN -> {after.status} with evidence ({before.reconciled})")

    @invariant()
    def the_receiver_accepted_at_most_once(self) -> None:
        # A request the receiver is still processing will be accepted: it counts already.
        taken = self.accepted + len(self.processing_until)
        assert taken <= 1, "the receiver accepted the logical event twice"

    def teardown(self) -> None:
        """The projection's fold of the same records, as read (redeliveries included),
        ends where the worker's fold ended."""
        # Steer generation towards long, varied fenced histories with stale outcomes.
        target(float(self.max_token), label="claims (fencing token)")
        target(float(len(self.transitions)), label="distinct transitions")
        target(float(self.stale), label="stale outcomes ignored")
        target(float(self.after_terminal), label="events landing after CONFIRMED/FAILED")
        target(float(self.not_found_while_processing), label="not found while processing")
        keyed = [e for e in self.landed if isinstance(e, DeliveryEvent)]
        rows = projection_fold(keyed, [len(keyed) // 2])
        (row,) = rows.values()
        assert row["status"] == self.state.status.public, (
            f"the projection says {row['status']}, the worker {self.state.status.public}"
        )
        assert (row["attempts"], row["fencing_token"]) == (
            self.state.attempt,
            self.state.fencing_token,
        )
        event(f"final {self.state.status.public}, worker and projection agree")

    @invariant()
    def confirmed_means_received(self) -> None:
        if self.state.status is Status.CONFIRMED:
            assert self.accepted == 1

    @invariant()
    def failed_means_not_received(self) -> None:
        if self.state.status is Status.FAILED:
            assert self.accepted + len(self.processing_until) == 0, "FAILED, the receiver has it"


def replace_seen(before: DeliveryState, after: DeliveryState) -> DeliveryState:
    """``before`` with ``after``'s dedupe window: a redelivery may only touch that."""
    from dataclasses import replace

    return replace(before, seen=after.seen)


DeliveryMachine.TestCase.settings = settings(
    max_examples=500, stateful_step_count=50, deadline=None
)
TestDeliveryMachine = DeliveryMachine.TestCase


@settings(max_examples=1, deadline=None)
@given(st.just(None))  # event() and target() need a hypothesis test around them
def test_a_receiver_slower_than_the_settle_window_is_not_retried_into(nothing: None) -> None:
    """The machine's hardest path, replayed step by step (hypothesis reaches it only now
    and then): the request is still being processed when the first lookup says "not
    found"; only the second "not found", one spacing later, may retry, and by then the
    receiver has it."""
    machine = DeliveryMachine()
    machine.tick(seconds=CTX.claim_grace_s + 1, noise=None)  # the claim is due
    machine.flush()
    assert machine.status() is Status.CLAIMED
    later = next(e for e in SEND_EFFECTS if e[0] == "later")
    machine.send(later)  # a timeout; the receiver finishes 17.5 s from now
    machine.flush()
    assert machine.status() is Status.UNKNOWN
    for _ in range(12):  # ticks of 3 s: lookups at the settle window, then spaced apart
        machine.tick(seconds=3.0, noise=None)
        machine.flush()
        machine.the_receiver_accepted_at_most_once()
        if machine.status() is Status.RETRY_SCHEDULED:
            machine.tick(seconds=40.0, noise=None)  # the retry is claimed...
            machine.flush()
            yes = next(e for e in SEND_EFFECTS if e[0] == "yes")
            machine.send(yes)  # ...and sent
            machine.the_receiver_accepted_at_most_once()
    assert machine.not_found_while_processing == 1
    assert machine.status() in (Status.SENT, Status.CONFIRMED)
    machine.teardown()
