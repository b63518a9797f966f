"""Finding runs: search by run id or idempotency key, and one run's incident page data."""

from __future__ import annotations

from typing import Any

from projections.fold import Row
from projections.incident import RunView, key_position, run_view
from projections.store import Store

SEARCH_LIMIT = 20
# A key prefix shorter than this would match too much to mean anything.
MIN_PREFIX = 4
# Longer than any run id or key: a longer query finds nothing and is not sent to SQL.
MAX_QUERY = 512
# One run's page: deliveries per request (a run may have tens of thousands).
RUN_PAGE = 100
MAX_RUN_PAGE = 500
_LAST = chr(0x10FFFF)


def _prefix_range(prefix: str) -> tuple[str, str]:
    """``[prefix, upper)``: a range that an ordinary (primary-key) index answers. A prefix
    ending in U+10FFFF (the last code point) carries into the character before it; one
    made of nothing else is bounded by a string of one more of them."""
    stem = prefix.rstrip(_LAST)
    if not stem:
        return prefix, prefix + _LAST
    return prefix, stem[:-1] + chr(ord(stem[-1]) + 1)


def searchable(query: str) -> str | None:
    """The query as SQL may be given it, or None when it cannot match anything: empty,
    too long, or holding a NUL or a lone surrogate (PostgreSQL refuses the first, UTF-8
    cannot carry the second)."""
    q = query.strip()
    if not q or len(q) > MAX_QUERY or "\x00" in q:
        return None
    try:
        q.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return q


def search(store: Store, query: str) -> list[Row]:
    """Runs whose id, or deliveries whose idempotency key, equals or starts with ``query``.

    Exact matches come first. Each match names the run, so the page can link to it.
    """
    q = searchable(query)
    if q is None:
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
            "fencing_token": d.delivery["fencing_token"],
        }
        for d in view.deliveries
    ]
    return {
        "execution_finished": view.execution,
        "deliveries": left,
    }


def run_page(
    store: Store, run_id: str, offset: int = 0, limit: int = RUN_PAGE, key: str | None = None
) -> dict[str, Any]:
    """One page of a run's view plus its answers (``LedgerError`` if the run is unknown):
    at most ``limit`` deliveries from ``offset``, or the page holding delivery ``key``."""
    limit = max(1, min(MAX_RUN_PAGE, limit))
    store.begin_read()
    try:
        if key is not None and (at := key_position(store, run_id, key)) is not None:
            offset = at - at % limit
        view = run_view(store, run_id, offset=max(0, offset), limit=limit)
    finally:
        store.rollback()
    data = view.to_json()
    end = view.offset + len(view.deliveries)
    data["page"] = {
        "offset": view.offset,
        "limit": limit,
        "total": view.total_deliveries,
        "next_offset": end if end < view.total_deliveries else None,
        "previous_offset": max(0, view.offset - limit) if view.offset > 0 else None,
    }
    return {"answers": answers(view), **data}
