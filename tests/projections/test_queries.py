"""The operators' questions and the incident view, on both backends, with ``now`` given."""

from __future__ import annotations

import uuid

import pytest

from clients.operator_actions import OperatorLog, redrive_action, resolve_action
from config.settings import Settings
from events import DeliveryClaimed, DeliveryFailed, DeliveryRetryScheduled
from events.delivery_state import Status
from events.errors import LedgerError
from events.outcomes import ErrorClass
from projections.backends import open_store
from projections.dashboard.overview import overview
from projections.fold import state_of_row
from projections.incident import run_view
from projections.projector import rebuild
from projections.queries import (
    PENDING_BY_CHANNEL,
    Backlog,
    ChannelBacklog,
    Selection,
    delivery_state,
    failed_deliveries,
    known_keys,
    operator_actions,
    selected_count,
    selected_deliveries,
    status_report,
)
from projections.store import Store
from tests.fixtures.postgres import DsnFactory
from tests.projections.scenarios import P, at, found_later, incident_log, publish, requested


async def built(settings: Settings, dsn_factory: DsnFactory) -> Store:
    await publish(settings, incident_log())
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    return store


async def test_status_answers_every_dashboard_question(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    store = await built(settings, dsn_factory)
    try:
        # run-b's delivery was requested at T0+100s with a 30 s SLO: due at T0+130s.
        before = status_report(store, at(129))
        assert before.overdue_pending == []
        after = status_report(store, at(131))
        assert after.overdue_sent == []  # nothing in the scenario is SENT
        b1 = requested("run-b", 1, 100, slo=30)
        assert [(r["idempotency_key"], r["slo_deadline"]) for r in after.overdue_pending] == [
            (b1.idempotency_key, "2026-01-05T09:02:10.000000Z")
        ]
        a3 = requested("run-a", 3, 1)
        assert [(r["idempotency_key"], r["last_error_class"]) for r in after.unknown] == [
            (a3.idempotency_key, "reset_after_write")
        ]
        c1 = requested("run-c", 1, 200)
        assert [
            (r["idempotency_key"], r["run_status"]) for r in after.confirmed_without_result
        ] == [(c1.idempotency_key, "RUNNING")]
        a1 = requested("run-a", 1, 1)
        assert [r["idempotency_key"] for r in after.duplicate_conflicts] == [a1.idempotency_key]
        assert after.attempts_by_channel == [
            {"channel": "provider", "error_class": None, "attempts": 1},
            {"channel": "provider", "error_class": "http_4xx", "attempts": 1},
            {"channel": "provider", "error_class": "http_5xx", "attempts": 1},
            {"channel": "provider", "error_class": "timeout_after_write", "attempts": 1},
            {"channel": "webhook", "error_class": None, "attempts": 2},
            {"channel": "webhook", "error_class": "reset_after_write", "attempts": 1},
        ]
        assert after.needs_attention
    finally:
        store.close()


async def test_sent_past_its_slo_is_overdue_too(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    a3 = requested("run-a", 3, 1)  # UNKNOWN; requested at T0+1s with a 60 s SLO
    await publish(settings, [*incident_log(), found_later(a3, 40)])  # found: SENT at T0+40s
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        assert status_report(store, at(60)).overdue_sent == []
        late = status_report(store, at(62))
        pmid = f"msg-{a3.idempotency_key[:6]}-found"
        assert [
            (r["idempotency_key"], r["slo_deadline"], r["provider_message_id"])
            for r in late.overdue_sent
        ] == [(a3.idempotency_key, "2026-01-05T09:01:01.000000Z", pmid)]
        assert late.unknown == []
        assert late.needs_attention
    finally:
        store.close()


async def test_run_view_is_one_timeline_with_the_keys_the_receiver_sees(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    store = await built(settings, dsn_factory)
    try:
        view = run_view(store, "run-a")
        assert view.execution == "finished: succeeded"
        a2 = requested("run-a", 2, 1)
        retried = next(
            d for d in view.deliveries if d.delivery["idempotency_key"] == a2.idempotency_key
        )
        assert retried.left_system == "yes (confirmed)"
        assert [a["attempt"] for a in retried.attempts] == [1, 2]
        times = [e.at for e in view.timeline]
        assert times == sorted(times)
        mine = [e.what for e in view.timeline if e.subject.endswith("/hooks/2")]
        key = a2.idempotency_key
        pmid = f"msg-{key[:6]}-2"
        assert mine == [
            f"delivery requested, idempotency key {key} (SLO 60s)",
            "attempt 1 claimed by w1 (fencing token 1)",
            "attempt 1 unknown: timeout_after_write",
            "attempt 1 reconciled: not_found",  # the attempt row keeps its last lookup
            "attempt 1 failed (timeout_after_write): retry scheduled for "
            "2026-01-05T09:00:12.000000Z",
            "attempt 2 claimed by w1 (fencing token 2)",
            f"attempt 2 sent: HTTP 202, provider message id {pmid}",
            f"attempt 2 confirmed, provider message id {pmid}",
            f"delivery CONFIRMED, provider message id {pmid}",
            "duplicate request (deduplicated)",
        ]
        assert view.timeline[0].what == "run started by reporter"
        no_result = run_view(store, "run-c")
        assert no_result.execution == "not finished (running)"
        with pytest.raises(LedgerError, match="run nope is not in the projection"):
            run_view(store, "nope")
    finally:
        store.close()


async def test_the_backlog_shows_pending_now_before_any_slo_passes(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    # Pending: run-b's webhook (T0+100s, 30 s SLO) and two more, all within 60 s SLOs.
    d2, d3 = requested("run-d", 2, 10), requested("run-d", 3, 20)  # provider, webhook
    await publish(settings, [*incident_log(), d2, d3])
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        early = status_report(store, at(50))
        assert early.overdue_pending == []  # nothing is late yet...
        assert early.backlog.pending_now == 3  # ...but the backlog shows at once
        assert early.backlog.oldest_requested_at == "2026-01-05T09:00:10.000000Z"
        assert early.backlog.oldest_age_seconds == 40.0
        # Ages are the reader's: the same projection read later shows older deliveries.
        later = status_report(store, at(130.5))
        assert later.backlog == Backlog(
            pending_now=3,
            oldest_requested_at="2026-01-05T09:00:10.000000Z",
            oldest_age_seconds=120.5,
            by_channel=[
                ChannelBacklog("provider", 1, "2026-01-05T09:00:10.000000Z", 120.5),
                ChannelBacklog("webhook", 2, "2026-01-05T09:00:20.000000Z", 110.5),
            ],
        )
        assert later.to_json()["backlog"]["by_channel"][1] == {
            "channel": "webhook",
            "pending": 2,
            "oldest_requested_at": "2026-01-05T09:00:20.000000Z",
            "oldest_age_seconds": 110.5,
        }
        # A reader whose clock is behind the producer's sees age 0, never a negative one.
        assert status_report(store, at(5)).backlog.oldest_age_seconds == 0.0
    finally:
        store.close()


async def test_no_backlog_reads_as_zero(settings: Settings, dsn_factory: DsnFactory) -> None:
    await publish(settings, incident_log()[:2])  # run-a started and succeeded: no delivery
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        assert status_report(store, at(10)).backlog == Backlog(0, None, 0.0, [])
    finally:
        store.close()


async def test_the_backlog_query_is_covered_by_an_index(
    settings: Settings, sqlite_factory: DsnFactory
) -> None:
    """Its cost follows the pending rows, not the whole table (timings: the commit note)."""
    store = await built(settings, sqlite_factory)
    try:
        plan = " ".join(
            str(r["detail"]) for r in store.rows(f"EXPLAIN QUERY PLAN {PENDING_BY_CHANNEL}")
        )
    finally:
        store.close()
    assert "USING COVERING INDEX deliveries_pending (status=?)" in plan, plan


async def test_attempts_by_channel_is_one_row_per_channel_and_error_class(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    """One class, two outcomes: http_5xx retried once, then FAILED when the policy ran out.
    "Attempts by channel and error class" counts both in one row (the dashboard's chart and
    ``ledger_attempts`` take one row per pair as the whole count); a row per outcome
    would show 1 where 2 attempts failed with http_5xx."""
    e2 = requested("run-e", 2, 10)  # provider
    common = {"idempotency_key": e2.idempotency_key, "run_id": "run-e", "producer": P}

    def claim(attempt: int, t: float) -> DeliveryClaimed:
        return DeliveryClaimed(
            **common, attempt=attempt, worker_id="w1", fencing_token=attempt,
            lease_expires_at=at(t + 30), occurred_at=at(t),
        )  # fmt: skip

    retry = DeliveryRetryScheduled(
        **common, attempt=1, next_attempt=2, retry_at=at(15), error_class=ErrorClass.HTTP_5XX,
        safety="receiver dedupes on webhook-id", occurred_at=at(12),
    )  # fmt: skip
    failed = DeliveryFailed(
        **common, attempts=2, error_class=ErrorClass.HTTP_5XX,
        reason="retries exhausted after attempt 2: 503", occurred_at=at(16),
    )  # fmt: skip
    await publish(settings, [e2, claim(1, 11), retry, claim(2, 15), failed])
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        report = status_report(store, at(20))
        page = overview(store, at(20))
    finally:
        store.close()
    assert report.attempts_by_channel == [
        {"channel": "provider", "error_class": "http_5xx", "attempts": 2}
    ]
    assert page.attempts_by_channel == report.attempts_by_channel
    counters = {c.name: c.value for c in page.counters}
    assert counters["failed_attempts"] == 2


async def test_operator_selections_combine_their_selectors(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    store = await built(settings, dsn_factory)
    # run-a: a1 CONFIRMED, a2 PENDING (a retry), a3 UNKNOWN, a4 FAILED (provider); b1
    # PENDING and c1 CONFIRMED go to a1's recipient (hook 1).
    a1, a2, a3, a4 = (requested("run-a", n, 1).idempotency_key for n in (1, 2, 3, 4))
    b1 = requested("run-b", 1, 100, slo=30).idempotency_key
    c1 = requested("run-c", 1, 200).idempotency_key
    hook1 = requested("run-a", 1, 1).recipient
    redrivable = ("FAILED", "UNKNOWN")

    def keys(selection: Selection, limit: int = 10) -> list[str]:
        return [r["idempotency_key"] for r in selected_deliveries(store, selection, limit)]

    try:
        assert sorted(keys(Selection(run_id="run-a", statuses=redrivable))) == sorted([a3, a4])
        assert keys(Selection(run_id="run-a", channel="provider", statuses=redrivable)) == [a4]
        assert keys(Selection(recipient=hook1)) == [a1, b1, c1]  # oldest request first
        assert keys(Selection(recipient=hook1), limit=2) == [a1, b1]
        assert keys(Selection(since=at(50), until=at(200))) == [b1]  # until: exclusive
        assert keys(Selection(keys=(a2, a3), statuses=("UNKNOWN",))) == [a3]
        assert sorted(keys(Selection(keys=(a1, a2)))) == sorted([a1, a2])
        assert selected_count(store, Selection(recipient=hook1, statuses=redrivable)) == 0
        settled = selected_count(
            store, Selection(recipient=hook1, statuses=redrivable), status="CONFIRMED"
        )
        assert settled == 2  # a1 and c1
        assert known_keys(store, [a1, "f" * 64]) == {a1}
        [row] = selected_deliveries(store, Selection(keys=(a3,)), 5)
        state = state_of_row(row)
        assert (state.idempotency_key, state.status) == (a3, Status.UNKNOWN)
        assert state.fencing_token == row["fencing_token"]
    finally:
        store.close()


def test_a_selection_names_its_scope_without_credentials() -> None:
    selection = Selection(
        keys=("k1", "k2"),
        run_id="r",
        recipient="https://user:pw@x.test/h",
        statuses=("FAILED",),
        since=at(0),
    )
    assert selection.scope() == (
        "keys=2 run=r recipient=https://x.test/h state=FAILED since=2026-01-05T09:00:00.000000Z"
    )


async def test_operator_actions_and_the_failed_table(
    settings: Settings, dsn_factory: DsnFactory
) -> None:
    a3, a4 = requested("run-a", 3, 1), requested("run-a", 4, 1)
    store = await built(settings, dsn_factory)
    try:
        [failed] = failed_deliveries(store)
        assert (failed["idempotency_key"], failed["last_error_class"]) == (
            a4.idempotency_key,
            "http_4xx",
        )
        assert failed["redrives"] == 0
        was_failed, was_unknown = (
            delivery_state(store, a4.idempotency_key),
            delivery_state(store, a3.idempotency_key),
        )
        assert delivery_state(store, "no-such-key") is None
    finally:
        store.close()
    assert was_failed is not None
    assert was_unknown is not None
    assert was_failed.status is Status.FAILED
    redrive = redrive_action(was_failed, operator="ann", reason="fixed", now=at(500)).event
    resolve = resolve_action(
        was_unknown, operator="ann", outcome="abandoned", reason="gone", now=at(501)
    ).event
    assert redrive is not None
    assert resolve is not None
    # The same redrive again: the fold refuses it (stale), and the projection says so.
    again = redrive.model_copy(update={"event_id": uuid.uuid4(), "occurred_at": at(502)})
    async with OperatorLog(settings) as log:  # signed, as the projection requires
        await log.append([redrive, resolve, again])
    dsn = dsn_factory()
    await rebuild(settings, dsn)
    store = open_store(dsn)
    store.prepare("read")
    try:
        assert [r["idempotency_key"] for r in failed_deliveries(store)] == [a3.idempotency_key]
        now = delivery_state(store, a4.idempotency_key)
        assert now is not None
        assert now.status is not Status.FAILED
        assert now.redrives == 1
        actions = operator_actions(store, "run-a")
        assert [(r["action"], r["result"]) for r in actions] == [
            ("redrive", "applied"),
            ("resolve", "applied"),
            ("redrive", "refused"),
        ]
        assert operator_actions(store, "run-a", [a3.idempotency_key]) == [actions[1]]
        assert operator_actions(store, "run-a", []) == []
        entries = [t for t in run_view(store, "run-a").timeline if t.operator]
        assert [(t.at, t.operator, t.result) for t in entries] == [
            ("2026-01-05T09:08:20.000000Z", "ann", "applied"),
            ("2026-01-05T09:08:21.000000Z", "ann", "applied"),
            ("2026-01-05T09:08:22.000000Z", "ann", "refused"),
        ]
        assert "redrive of the FAILED delivery, reason: fixed (applied)" in entries[0].what
        assert "resolve as abandoned of the UNKNOWN delivery, reason: gone" in entries[1].what
        assert "(refused: redrive applies to FAILED and UNKNOWN" in entries[2].what
    finally:
        store.close()
