"""One run's incident view: did it finish, did each delivery leave, which key the receiver sees.

Built from the ledger tables alone, as one timeline ordered by event time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from events.errors import LedgerError
from events.redaction import redacted_data
from projections.fold import Row
from projections.queries import operator_actions
from projections.store import Store

AddEntry = Callable[[str | None, str, str], None]
AddAction = Callable[[str, str, str, str, str], None]

# Whether a delivery left the system, by status.
LEFT = {
    "PENDING": "no",
    "SENT": "yes (accepted, not yet confirmed)",
    "CONFIRMED": "yes (confirmed)",
    "UNKNOWN": "unknown (awaiting reconciliation)",
    "FAILED": "no (failed)",
}


@dataclass(frozen=True)
class TimelineEntry:
    """Something that happened, when, and to what; an operator's action also says who,
    and whether the fold applied it (``applied``) or not (``refused``)."""

    at: str
    subject: str
    what: str
    operator: str | None = None
    result: str | None = None


@dataclass
class DeliveryView:
    """One delivery of the run, with its attempts."""

    delivery: Row
    attempts: list[Row]
    duplicates: list[Row]
    left_system: str


@dataclass
class RunView:
    """The incident view of one run."""

    run_id: str
    run: Row | None
    execution: str
    deliveries: list[DeliveryView] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    # The run's deliveries in all; ``deliveries`` holds those from ``offset`` on (a page).
    total_deliveries: int = 0
    offset: int = 0

    def to_json(self) -> dict[str, Any]:
        """The view as JSON-compatible data."""
        return asdict(self)


def _shown(rows: list[Row]) -> list[Row]:
    # A view is for showing: URLs from events (recipients, reasons) lose their credentials.
    shown: list[Row] = redacted_data(rows)
    return shown


def run_not_found(run_id: str) -> LedgerError:
    """What is said of a run the projection does not hold (or that a reader may not see)."""
    return LedgerError(
        f"run {run_id} is not in the projection",
        "check the run id, or that 'ledger project' has caught up",
    )


def run_view(store: Store, run_id: str, *, offset: int = 0, limit: int | None = None) -> RunView:
    """What the projection knows about ``run_id``, URLs redacted (``events.redaction``):
    the run, and its deliveries from ``offset`` on, at most ``limit`` of them (None: all),
    with their attempts and timeline; ``LedgerError`` if nothing."""
    runs = _shown(store.rows("SELECT * FROM agent_runs WHERE run_id = ?", (run_id,)))
    total = _count(store, run_id)
    if limit is None:
        found = store.rows(
            "SELECT * FROM deliveries WHERE run_id = ? ORDER BY created_at, idempotency_key",
            (run_id,),
        )
    else:
        found = store.rows(
            "SELECT * FROM deliveries WHERE run_id = ? ORDER BY created_at, idempotency_key "
            "LIMIT ? OFFSET ?",
            (run_id, limit, offset),
        )
    deliveries = _shown(found)
    for row in deliveries:
        del row["state"]  # the fold's bookkeeping, not part of the incident view
    if not runs and not total:
        raise run_not_found(run_id)
    run = runs[0] if runs else None
    view = RunView(run_id, run, _execution(run), total_deliveries=total, offset=offset)
    attempts = _of_page(
        store,
        "SELECT * FROM delivery_attempts WHERE run_id = ?{keys} ORDER BY idempotency_key, attempt",
        run_id,
        deliveries if limit is not None else None,
    )
    duplicates = _of_page(
        store,
        "SELECT * FROM duplicate_keys WHERE run_id = ?{keys} ORDER BY occurred_at, event_id",
        run_id,
        deliveries if limit is not None else None,
    )
    actions = _shown(
        operator_actions(
            store,
            run_id,
            [row["idempotency_key"] for row in deliveries] if limit is not None else None,
        )
    )
    events: list[tuple[str, int, TimelineEntry]] = []

    def add(at: str | None, subject: str, what: str) -> None:
        if at is not None:
            # The sequence number keeps same-instant entries in causal (insertion) order.
            events.append((at, len(events), TimelineEntry(at, subject, what)))

    def add_action(at: str, subject: str, what: str, operator: str, result: str) -> None:
        events.append((at, len(events), TimelineEntry(at, subject, what, operator, result)))

    if run is not None:
        _run_entries(run, add)
    for delivery in deliveries:
        key = delivery["idempotency_key"]
        mine = [a for a in attempts if a["idempotency_key"] == key]
        dups = [d for d in duplicates if d["idempotency_key"] == key]
        view.deliveries.append(DeliveryView(delivery, mine, dups, LEFT[delivery["status"]]))
        _delivery_entries(delivery, mine, dups, add)
        for action in actions:
            if action["idempotency_key"] == key:
                _action_entry(delivery, action, add_action)
    view.timeline = [entry for _, _, entry in sorted(events, key=lambda e: (e[0], e[1]))]
    return view


def _count(store: Store, run_id: str) -> int:
    [row] = store.rows("SELECT COUNT(*) AS n FROM deliveries WHERE run_id = ?", (run_id,))
    return int(row["n"])


def _of_page(store: Store, sql: str, run_id: str, page: list[Row] | None) -> list[Row]:
    """Rows of the run (``page`` None), or of the page's deliveries only."""
    if page is None:
        return _shown(store.rows(sql.format(keys=""), (run_id,)))
    if not page:
        return []
    keys = [row["idempotency_key"] for row in page]
    marks = ", ".join("?" * len(keys))
    where = f" AND idempotency_key IN ({marks})"
    return _shown(store.rows(sql.format(keys=where), (run_id, *keys)))


def key_position(store: Store, run_id: str, key: str) -> int | None:
    """Where delivery ``key`` sits among the run's deliveries (the view's order), or None."""
    found = store.rows(
        "SELECT created_at FROM deliveries WHERE run_id = ? AND idempotency_key = ?",
        (run_id, key),
    )
    if not found:
        return None
    [row] = store.rows(
        "SELECT COUNT(*) AS n FROM deliveries WHERE run_id = ? AND "
        "(created_at < ? OR (created_at = ? AND idempotency_key < ?))",
        (run_id, found[0]["created_at"], found[0]["created_at"], key),
    )
    return int(row["n"])


def _execution(run: Row | None) -> str:
    if run is None:
        return "no execution events (the run never reported)"
    return {
        "RUNNING": "not finished (running)",
        "SUCCEEDED": "finished: succeeded",
        "FAILED": "finished: failed",
        "UNKNOWN": "unknown (marked unknown)",
    }[run["status"]]


def _run_entries(run: Row, add: AddEntry) -> None:
    agent = f" by {run['agent']}" if run["agent"] else ""
    add(run["started_at"], "run", f"run started{agent}")
    if run["status"] == "SUCCEEDED":
        add(run["finished_at"], "run", f"run succeeded, result {run['result_hash']}")
    elif run["status"] == "FAILED":
        add(run["finished_at"], "run", f"run failed: {run['error']}")
    elif run["status"] == "UNKNOWN":
        add(run["updated_at"], "run", f"run marked unknown: {run['error']}")


def _delivery_entries(delivery: Row, attempts: list[Row], dups: list[Row], add: AddEntry) -> None:
    subject = f"{delivery['channel']} {delivery['recipient']}"
    add(
        delivery["created_at"],
        subject,
        f"delivery requested, idempotency key {delivery['idempotency_key']} "
        f"(SLO {delivery['slo_seconds']}s)",
    )
    for a in attempts:
        n = a["attempt"]
        if a["claimed_at"]:
            add(
                a["claimed_at"],
                subject,
                f"attempt {n} claimed by {a['worker_id']} (fencing token {a['fencing_token']})",
            )
        if a["sent_at"]:
            status = f"HTTP {a['http_status']}" if a["http_status"] is not None else "accepted"
            pmid = a["provider_message_id"] or "none"
            add(a["sent_at"], subject, f"attempt {n} sent: {status}, provider message id {pmid}")
        if a["unknown_at"]:
            add(a["unknown_at"], subject, f"attempt {n} unknown: {a['error_class']}")
        if a["reconciled_at"]:
            add(a["reconciled_at"], subject, f"attempt {n} reconciled: {a['reconciliation']}")
        if a["retry_scheduled_at"]:
            add(
                a["retry_scheduled_at"],
                subject,
                f"attempt {n} failed ({a['error_class']}): retry scheduled for {a['retry_at']}",
            )
        if a["confirmed_at"]:
            pmid = a["provider_message_id"] or "none"
            add(a["confirmed_at"], subject, f"attempt {n} confirmed, provider message id {pmid}")
        if a["failed_at"]:
            add(a["failed_at"], subject, f"attempt {n} failed: {a['error_class']} ({a['reason']})")
    for dup in dups:
        add(dup["occurred_at"], subject, f"duplicate request ({dup['outcome']})")
    if delivery["confirmed_at"]:
        pmid = delivery["provider_message_id"] or "none"
        add(delivery["confirmed_at"], subject, f"delivery CONFIRMED, provider message id {pmid}")
    if delivery["failed_at"]:
        add(delivery["failed_at"], subject, f"delivery FAILED: {delivery['last_error_class']}")


def _action_entry(delivery: Row, action: Row, add: AddAction) -> None:
    """An operator's action: who, what, why, and whether it applied (if not, why not)."""
    subject = f"{delivery['channel']} {delivery['recipient']}"
    if action["action"] == "resolve":
        did = f"resolve as {action['outcome'].replace('_', ' ')}"
        if action["receiver_id"]:
            did += f" (receiver id {action['receiver_id']})"
    else:
        did = "redrive"
    result = action["result"]
    outcome = "applied" if result == "applied" else f"refused: {action['refusal']}"
    what = (
        f"operator {action['operator']}: {did} of the {action['seen_status']} delivery, "
        f"reason: {action['reason']} ({outcome})"
    )
    add(action["occurred_at"], subject, what, action["operator"], result)
