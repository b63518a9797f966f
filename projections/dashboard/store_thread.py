"""The dashboard's one store thread: every query runs there, so the store's connection is
never shared between threads and the event loop never waits on SQL. A projection
database that stops answering (a PostgreSQL restart) is reconnected to, with backoff,
within one request's budget; past it the request is a 503 and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from events.errors import LedgerError
from events.outage import Backoff, Outage, reason
from projections.dashboard.errors import Refused
from projections.database import redacted
from projections.queries import AggregateCache
from projections.store import Store

T = TypeVar("T")

# How long one request waits for a projection database that stopped answering (then 503).
REQUEST_BUDGET_S = 3.0
RETRY_AFTER_S = 5
MAX_TRIES = 100


class ProjectionUnavailable(Exception):
    """The projection database did not answer within one request's budget."""


class StoreThread:
    """``store`` used from one dedicated thread; ``cache`` lives there too."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # One thread owns the connection: SQLite connections must not be used concurrently.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-store")
        # Used only from the store's thread, like the connection itself.
        self.cache = AggregateCache()
        self._outage = Outage(
            logging.getLogger("ledger.dashboard"),
            f"projection database {redacted(store.dsn)}",
            limit_s=math.inf,
        )

    async def run(self, work: Callable[[Store], T]) -> T:
        """``work(store)`` in the store's thread; a 503 (``Refused``) when the database
        does not answer within ``REQUEST_BUDGET_S``."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._reconnecting, work)
        except ProjectionUnavailable as exc:
            raise Refused(
                503,
                "the projection database is unavailable",
                "it is restarting or unreachable; the dashboard reconnects by itself",
                detail=str(exc),
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None

    def close(self) -> None:
        """Wait for the query in progress, then end the thread (the store stays open)."""
        self._executor.shutdown(wait=True)

    def _reconnecting(self, work: Callable[[Store], T]) -> T:
        """``work`` on the store (in the store's thread); on the database's own failure,
        reconnect (with backoff) within ``REQUEST_BUDGET_S``, else ``ProjectionUnavailable``.
        The outage is logged once when it begins and once when it ends."""
        store, outage = self.store, self._outage
        deadline = time.monotonic() + REQUEST_BUDGET_S
        backoff = Backoff()
        for attempt in range(MAX_TRIES):
            try:
                if attempt or outage.ongoing:
                    store.reconnect()  # the old connection died with the server
                result = work(store)
            except store.system_errors as exc:
                outage.failed(exc)
                # The first failure may be only a connection the restart left behind: at once.
                delay = 0.0 if attempt == 0 else backoff.next_delay()
                if time.monotonic() + delay >= deadline:
                    raise ProjectionUnavailable(reason(exc)) from None
                time.sleep(delay)
                continue
            except LedgerError as exc:  # reconnect refused: a configuration error
                if attempt == 0 and not outage.ongoing:
                    raise  # not from reconnecting: the work's own answer (e.g. no such run)
                outage.failed(exc)
                raise ProjectionUnavailable(f"{exc.message} ({exc.hint})") from None
            outage.recovered()
            return result
        raise ProjectionUnavailable("too many attempts")
