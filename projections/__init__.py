"""Projections: fold the log into ledger tables; rebuild, verify, the operators' questions.

    store = open_store(default_dsn(settings))      # or "postgresql://..."
    store.prepare("read")
    report = status_report(store, now)             # now: the caller's clock, never ours
    view = run_view(store, "run-42")

Modules: ``schema`` (tables, version), ``fold`` (pure event folding), ``store`` (the
SQL store and its exactly-once batch), ``sqlite`` / ``postgres`` (backends), ``log``
(reading the topics), ``projector`` (project, rebuild), ``parallel_rebuild`` (a rebuild
in several processes; ``rebuild_worker`` its worker process), ``stats`` (what a run
reports), ``verify``, ``queries``,
``incident`` (one run's timeline).
"""

from events.errors import LedgerError
from projections.backends import default_dsn, open_store
from projections.incident import RunView, run_view
from projections.projector import ProjectionStats, project, rebuild
from projections.queries import StatusReport, status_report
from projections.schema import SCHEMA_VERSION
from projections.store import PROJECTOR_MID_BATCH, Store
from projections.verify import VerifyReport, verify

__all__ = [
    "PROJECTOR_MID_BATCH",
    "SCHEMA_VERSION",
    "LedgerError",
    "ProjectionStats",
    "RunView",
    "StatusReport",
    "Store",
    "VerifyReport",
    "default_dsn",
    "open_store",
    "project",
    "rebuild",
    "run_view",
    "status_report",
    "verify",
]
