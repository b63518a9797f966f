"""Finding runs: search by run id or idempotency key, and one run's incident page data."""

from __future__ import annotations

from typing import Any

from projections.fold import Row
from projections.incident import RunView, run_view
from projections.store import Store

SEARCH_LIMIT = 20
# A key prefix shorter than this would match too much to mean anything.
MIN_PREFIX = 4


def _prefix_range(prefix: str) -> tuple[str, str]:
    """``[prefix, upper)``: a range that an ordinary (primary-key) index answers."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def search(store: Store, query: str) -> list[Row]:
    """Runs whose id, or deliveries whose idempotency key, equals or starts with ``query``.

    Exact matches come first. Each match names the run, so the page can link to it.
    """
    q = query.strip()
    if not q:
        return []
    matches: list[Row] = []
    seen: set[tuple[str, str | None]] = set()

    def add(rows: list[Row], kind: str) -> None:
        for row in rows:
            ident = (row["run_id"], row.get("idempotency_key"))
            if ident not in seen and len(matches) < SEARCH_LIMIT:
                seen.add(ident)
                matches.append({"kind": kind, **row})

    add(store.rows("SELECT run_id, status FROM agent_runs WHERE run_id = ?", (q,)), "run")
    add(
        store.rows("SELECT DISTINCT run_id FROM deliveries WHERE run_id = ?", (q,)),
        "run",
    )
    add(
        store.rows(
            "SELECT idempotency_key, run_id, channel, recipient, status FROM deliveries "
            "WHERE idempotency_key = ?",
            (q.lower(),),
        ),
        "delivery",
    )
    if len(q) >= MIN_PREFIX:
        low, high = _prefix_range(q)
        add(
            store.rows(
                "SELECT run_id, status FROM agent_runs WHERE run_id >= ? AND run_id < ? "
                "ORDER BY run_id LIMIT ?",
                (low, high, SEARCH_LIMIT),
            ),
            "run",
        )
        low, high = _prefix_range(q.lower())
        add(
            store.rows(
                "SELECT idempotency_key, run_id, channel, recipient, status FROM deliveries "
                "WHERE idempotency_key >= ? AND idempotency_key < ? "
                "ORDER BY idempotency_key LIMIT ?",
                (low, high, SEARCH_LIMIT),
            ),
            "delivery",
        )
    for match in matches:
        match.setdefault("idempotency_key", None)
    return matches


def answers(view: RunView) -> dict[str, Any]:
    """The three incident questions, answered in words for the page's header."""
    left = [
        {
            "idempotency_key": d.delivery["idempotency_key"],
            "channel": d.delivery["channel"],
            "recipient": d.delivery["recipient"],
            "status": d.delivery["status"],
            "left_system": d.left_system,
            "provider_message_id": d.delivery["provider_message_id"],
        }
        for d in view.deliveries
    ]
    return {
        "execution_finished": view.execution,
        "deliveries": left,
    }


def run_page(store: Store, run_id: str) -> dict[str, Any]:
    """One run's view plus its answers (``LedgerError`` if the run is unknown)."""
    store.begin_read()
    try:
        view = run_view(store, run_id)
    finally:
        store.rollback()
    return {"answers": answers(view), **view.to_json()}
