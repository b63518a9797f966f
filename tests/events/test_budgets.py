"""The budget rule (events/budgets.py), broker-free: log order decides, windows renew,
releases grant the oldest held first, and repeated spends change nothing."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.budgets import (
    BudgetBook,
    BudgetCleared,
    BudgetDecodeError,
    BudgetReleased,
    BudgetSet,
    BudgetSpent,
    Verdict,
    decode_budget,
    encode_budget,
    parse_window,
    window_text,
)
from tests.fixtures.core import T0

AGENT = "runaway-agent"
HOUR = 3600


def key(n: int) -> str:
    return hashlib.sha256(f"delivery-{n}".encode()).hexdigest()


def set_budget(
    limit: int, window_s: int = HOUR, at: datetime = T0, channel: str | None = None
) -> BudgetSet:
    return BudgetSet(
        agent=AGENT,
        channel=channel,
        limit=limit,
        window_s=window_s,
        operator="ana",
        reason="runaway loop",
        producer="ledger-operator",
        occurred_at=at,
    )


def spent(n: int, window_start: datetime = T0, channel: str = "webhook") -> BudgetSpent:
    return BudgetSpent(
        agent=AGENT,
        channel=channel,
        idempotency_key=key(n),
        window_start=window_start,
        producer="ledger-worker/w1",
    )


def released(count: int, at: datetime = T0, channel: str | None = None) -> BudgetReleased:
    return BudgetReleased(
        agent=AGENT,
        channel=channel,
        count=count,
        operator="ana",
        reason="checked: legitimate",
        producer="ledger-operator",
        occurred_at=at,
    )


def verdict(book: BudgetBook, n: int, now: datetime = T0, channel: str = "webhook") -> Verdict:
    return book.judge(AGENT, channel, key(n), now).verdict


def test_the_first_n_distinct_keys_in_log_order_are_within_budget() -> None:
    book = BudgetBook().apply_all([set_budget(3), *(spent(n) for n in (5, 1, 4, 2))])
    assert [verdict(book, n) for n in (5, 1, 4)] == [Verdict.GRANTED] * 3
    assert verdict(book, 2) is Verdict.OVER, "the fourth spend in log order is over"
    assert verdict(book, 9) is Verdict.OVER, "the window is full: a new key waits unspent"
    judged = book.judge(AGENT, "webhook", key(9), T0 + timedelta(minutes=5))
    assert (judged.limit, judged.used) == (3, 3)
    assert judged.window_end == T0 + timedelta(hours=1)
    assert book.held(AGENT) == 1


def test_a_key_not_spent_yet_in_a_window_with_room_is_to_be_spent() -> None:
    book = BudgetBook().apply_all([set_budget(2), spent(1)])
    assert verdict(book, 2) is Verdict.ROOM
    assert book.judge("another-agent", "webhook", key(2), T0).verdict is Verdict.UNBUDGETED
    assert book.judge(None, "webhook", key(2), T0).verdict is Verdict.UNBUDGETED


def test_repeated_spends_change_nothing() -> None:
    once = BudgetBook().apply_all([set_budget(2), spent(1), spent(2), spent(3)])
    again = BudgetBook().apply_all(
        [set_budget(2), spent(1), spent(1), spent(2), spent(1), spent(3), spent(2), spent(3)]
    )
    for n in (1, 2, 3):
        assert verdict(once, n) == verdict(again, n)
    assert verdict(again, 3) is Verdict.OVER
    # A granted key spent again in a later window (a retry) takes no slot there.
    later = T0 + timedelta(hours=1)
    again.apply_all([spent(1, later), spent(4, later), spent(5, later)])
    assert verdict(again, 1, later) is Verdict.GRANTED
    assert [verdict(again, n, later) for n in (4, 5)] == [Verdict.GRANTED] * 2


def test_a_new_window_renews_the_budget_and_the_held_spend_again() -> None:
    book = BudgetBook().apply_all([set_budget(1, at=T0), spent(1), spent(2)])
    assert verdict(book, 2) is Verdict.OVER
    later = T0 + timedelta(hours=1, seconds=1)
    assert verdict(book, 2, later) is Verdict.ROOM, "held in the old window, spends in the new"
    book.apply(spent(2, T0 + timedelta(hours=1)))
    assert verdict(book, 2, later) is Verdict.GRANTED
    assert verdict(book, 3, later) is Verdict.OVER


def test_windows_start_at_the_budgets_anchor() -> None:
    anchor = T0 + timedelta(minutes=17)
    book = BudgetBook().apply_all([set_budget(1, at=anchor)])
    judged = book.judge(AGENT, "webhook", key(1), anchor + timedelta(minutes=90))
    assert judged.window_start == anchor + timedelta(hours=1)
    # The same window again keeps the anchor and the counts; another starts afresh.
    book.apply_all([spent(1, anchor), set_budget(5, at=anchor + timedelta(minutes=5))])
    assert book.judge(AGENT, "webhook", key(2), anchor).used == 1
    book.apply(set_budget(5, window_s=60, at=anchor + timedelta(minutes=6)))
    assert book.judge(AGENT, "webhook", key(1), anchor + timedelta(minutes=6)).used == 0


def test_a_release_grants_the_oldest_held_first_then_adds_allowance() -> None:
    book = BudgetBook().apply_all([set_budget(1), spent(1), spent(2), spent(3)])
    assert [verdict(book, n) for n in (2, 3)] == [Verdict.OVER] * 2
    book.apply(released(1))
    assert verdict(book, 2) is Verdict.GRANTED, "the oldest held goes first"
    assert verdict(book, 3) is Verdict.OVER
    first = released(2)
    book.apply_all([first, first.model_copy()])  # the same release, read twice
    assert verdict(book, 3) is Verdict.GRANTED
    # What is left of the count is allowance in the release's window: one more may go.
    assert verdict(book, 4) is Verdict.ROOM
    book.apply_all([spent(4), spent(5)])
    assert verdict(book, 4) is Verdict.GRANTED
    assert verdict(book, 5) is Verdict.OVER
    assert book.held(AGENT) == 1


def test_a_release_counts_in_its_own_window() -> None:
    book = BudgetBook().apply_all([set_budget(0), released(1, at=T0 + timedelta(hours=2))])
    assert verdict(book, 1) is Verdict.OVER, "the allowance is for the release's window"
    assert verdict(book, 1, T0 + timedelta(hours=2)) is Verdict.ROOM


def test_a_channel_budget_comes_before_the_agents_every_channel_one() -> None:
    book = BudgetBook().apply_all(
        [
            set_budget(1),
            set_budget(2, channel="slack"),
            spent(1),
            spent(2),
            spent(3, channel="slack"),
        ]
    )
    assert verdict(book, 2) is Verdict.OVER
    assert verdict(book, 3, channel="slack") is Verdict.GRANTED
    assert verdict(book, 4, channel="slack") is Verdict.ROOM
    book.apply(
        BudgetCleared(agent=AGENT, operator="ana", reason="done", producer="ledger-operator")
    )
    assert verdict(book, 2) is Verdict.UNBUDGETED, "cleared: nothing of it holds"
    assert verdict(book, 4, channel="slack") is Verdict.ROOM


# Any log of spends, repeated at least once anywhere after the first: the same verdicts.
spends = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 2)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    log=spends,
    repeats=st.lists(st.tuples(st.integers(0, 39), st.integers(0, 60)), max_size=20),
    limit=st.integers(0, 5),
    release_at=st.integers(0, 60),
)
def test_repeated_spends_anywhere_later_never_change_a_verdict(
    log: list[tuple[int, int]],
    repeats: list[tuple[int, int]],
    limit: int,
    release_at: int,
) -> None:
    events: list[BudgetSpent | BudgetReleased] = [spent(n, T0 + timedelta(hours=w)) for n, w in log]
    events.insert(min(release_at, len(events)), released(2))
    noisy = list(events)
    for which, offset in repeats:
        original = events[which % len(events)]
        if isinstance(original, BudgetReleased):
            continue
        at = noisy.index(original) + 1 + offset
        noisy.insert(min(at, len(noisy)), original.model_copy())
    clean = BudgetBook().apply_all([set_budget(limit), *events])
    repeated = BudgetBook().apply_all([set_budget(limit), *noisy])
    for w in range(3):
        now = T0 + timedelta(hours=w)
        for n in range(13):
            assert verdict(clean, n, now) == verdict(repeated, n, now)
        granted = clean.budgets[(AGENT, None)].windows.get(now)
        if granted is not None:
            assert len(granted.granted) <= limit + granted.allowance


def test_budget_events_round_trip_and_bad_records_are_refused_in_one_line() -> None:
    for event in (set_budget(3), spent(1), released(1)):
        assert decode_budget(encode_budget(event)) == event
    for bad, says in (
        (None, "tombstone"),
        (b"\xff", "not JSON"),
        (b"{}", "invalid budget event"),
        (b'{"type": "budget.spent", "agent": "a"}', "invalid budget event"),
        (b"x" * 70_000, "over"),
    ):
        with pytest.raises(BudgetDecodeError, match=says) as raised:
            decode_budget(bad)
        assert "\n" not in str(raised.value)


def test_windows_are_parsed_and_shown_in_units() -> None:
    assert [parse_window(w) for w in ("30s", "15m", "1h", "7d")] == [30, 900, 3600, 604800]
    assert [window_text(s) for s in (30, 900, 3600, 86400, 90)] == ["30s", "15m", "1h", "1d", "90s"]
    for bad in ("", "1", "h", "1w", "0s", "400d", "-1h"):
        with pytest.raises(ValueError, match="is not a number and a unit"):
            parse_window(bad)
