"""The SLO a delivery is judged by, and the deliveries past it ("overdue").

A delivery's request carries ``slo_seconds`` (the agent's, else the publisher's
``LEDGER_PUBLISHER__DEFAULT_SLO_S``), folded into ``deliveries.slo_deadline``. A
registered endpoint may set its own (``ledger endpoints add|update ID --slo-s N``): where
it does, **the registry's SLO wins** for every delivery of that endpoint, requested
before the change or after, and the deadline is ``requested_at + slo_s``. An endpoint
without one, an endpoint of the environment fallback, or no endpoint at all: the
request's SLO.

The registry's SLO is applied when the question is asked, not folded into the rows: the
projection reads ``ledger.endpoints`` beside ``ledger.deliveries`` in no fixed order, so a
deadline folded at request time would depend on which came first (and a rebuild could
differ from the live projection); read at question time, an ``update`` applies at the
next question, with no rebuild. A recipient belongs to the endpoint the workers send it
under (projections/endpoint_owners.py).

How: the open recipients of the endpoints' channels are read once per question (``SELECT
DISTINCT channel, recipient``: rows grow with the distinct recipients, not with the
deliveries), placed in their endpoints, and grouped by SLO; each group is asked for
``created_at`` before ``now - slo_s`` (the times are fixed-width UTC text: no date
arithmetic in SQL), everything else by its own ``slo_deadline`` as before. With no
endpoint SLO set, a question is the one query it always was.

The CLI (``ledger status``), the dashboard and ``/metrics`` all ask through here
(projections/queries.py). Nothing here reads the clock: ``now`` is the caller's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from projections.endpoint_owners import EndpointOwners
from projections.fold import Row
from projections.schema import timestamp
from projections.store import Store

# Recipients per IN list: two parameters each, far below either backend's limit.
CHUNK = 250
# Rows read per page while skipping the rows an endpoint's SLO judges instead.
PAGE = 500

Pair = tuple[str, str]  # (channel, recipient)


@dataclass(frozen=True)
class EndpointSlos:
    """Recipients of deliveries in one status whose registered endpoint sets an SLO,
    grouped by that SLO (seconds)."""

    groups: dict[int, list[Pair]] = field(default_factory=dict)

    @property
    def judged(self) -> frozenset[Pair]:
        """Every recipient an endpoint's SLO judges (not its requests' own)."""
        return frozenset(p for pairs in self.groups.values() for p in pairs)


def endpoint_slos(store: Store, status: str) -> EndpointSlos:
    """The recipients of ``status`` deliveries whose registered endpoint sets an SLO."""
    registry = store.rows("SELECT endpoint_id, channel, address, slo_s FROM endpoints")
    slos = {r["endpoint_id"]: int(r["slo_s"]) for r in registry if r["slo_s"] is not None}
    if not slos:
        return EndpointSlos()
    owners = EndpointOwners(registry)
    channels = sorted({r["channel"] for r in registry if r["endpoint_id"] in slos})
    marks = ", ".join("?" * len(channels))
    sql = (
        "SELECT DISTINCT channel, recipient FROM deliveries WHERE status = ? "  # noqa: S608
        f"AND channel IN ({marks})"
    )
    recipients = store.rows(sql, (status, *channels))
    groups: dict[int, list[Pair]] = {}
    for r in recipients:
        endpoint_id = owners.registered(r["channel"], r["recipient"])
        if endpoint_id in slos:
            groups.setdefault(slos[endpoint_id], []).append((r["channel"], r["recipient"]))
    return EndpointSlos({k: sorted(v) for k, v in sorted(groups.items())})


def overdue(
    store: Store, status: str, columns: str, now: datetime, limit: int | None = None
) -> list[Row]:
    """``status`` deliveries past their SLO at ``now`` (``columns`` of each, with
    ``slo_deadline`` the deadline they are judged by), most overdue first."""
    slos = endpoint_slos(store, status)
    at = timestamp(now)
    own = (
        f"SELECT {columns} FROM deliveries WHERE status = ? AND slo_deadline < ? "  # noqa: S608
        "ORDER BY slo_deadline, idempotency_key"
    )
    if not slos.groups:
        return _limited(store, own, (status, at), limit)
    found = list(_skipping(store, own, (status, at), limit, slos.judged))
    for slo_s, pairs in slos.groups.items():
        cutoff = timestamp(now - timedelta(seconds=slo_s))
        for where, params in _in_chunks(pairs):
            sql = (
                f"SELECT {columns}, created_at AS slo_from FROM deliveries "  # noqa: S608 - constants
                f"WHERE status = ? AND created_at < ? AND ({where}) "
                "ORDER BY created_at, idempotency_key"
            )
            for row in _limited(store, sql, (status, cutoff, *params), limit):
                requested = datetime.fromisoformat(row.pop("slo_from"))
                row["slo_deadline"] = timestamp(requested + timedelta(seconds=slo_s))
                found.append(row)
    found.sort(key=lambda r: (r["slo_deadline"], r["idempotency_key"]))
    return found if limit is None else found[:limit]


def overdue_count(store: Store, status: str, now: datetime) -> int:
    """How many ``status`` deliveries are past their SLO at ``now`` (``overdue``'s rows)."""
    slos = endpoint_slos(store, status)
    at = timestamp(now)
    own = "FROM deliveries WHERE status = ? AND slo_deadline < ?"
    total = _count(store, own, (status, at))
    for slo_s, pairs in slos.groups.items():
        cutoff = timestamp(now - timedelta(seconds=slo_s))
        for where, params in _in_chunks(pairs):
            # Judged by the endpoint's SLO: out of the requests' count, into the endpoint's.
            total -= _count(store, f"{own} AND ({where})", (status, at, *params))
            total += _count(
                store,
                f"FROM deliveries WHERE status = ? AND created_at < ? AND ({where})",
                (status, cutoff, *params),
            )
    return total


def _count(store: Store, source: str, params: Sequence[Any]) -> int:
    return int(store.rows(f"SELECT COUNT(*) AS n {source}", params)[0]["n"])


def _limited(store: Store, sql: str, params: Sequence[Any], limit: int | None) -> list[Row]:
    if limit is None:
        return store.rows(sql, params)
    return store.rows(f"{sql} LIMIT ?", (*params, limit))


def _skipping(
    store: Store, sql: str, params: Sequence[Any], limit: int | None, skip: frozenset[Pair]
) -> Iterator[Row]:
    """The rows of ``sql`` whose recipient is not in ``skip``: at most ``limit``, read a
    page at a time."""
    if limit is None:
        yield from (
            r for r in store.rows(sql, params) if (r["channel"], r["recipient"]) not in skip
        )
        return
    given, offset = 0, 0
    while given < limit:
        page = store.rows(f"{sql} LIMIT ? OFFSET ?", (*params, PAGE, offset))
        for row in page:
            if (row["channel"], row["recipient"]) not in skip:
                yield row
                given += 1
                if given >= limit:
                    return
        if len(page) < PAGE:
            return
        offset += PAGE


def _in_chunks(pairs: Sequence[Pair]) -> Iterator[tuple[str, list[str]]]:
    """(SQL matching any of a chunk of recipients, its parameters), chunk by chunk."""
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start : start + CHUNK]
        where = " OR ".join(["(channel = ? AND recipient = ?)"] * len(chunk))
        yield where, [value for pair in chunk for value in pair]
