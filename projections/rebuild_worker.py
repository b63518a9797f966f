"""A parallel rebuild's worker process (``python -m projections.rebuild_worker --worker=N``):
it folds its share of the partitions into its own stage, as a sequential rebuild would,
and reports to its parent (projections/parallel_rebuild.py) in JSON lines on stdout.

Apart from projections/parallel_rebuild.py, which projections/projector.py uses, so that
the worker's use of ``project`` makes no circle."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import sys
from dataclasses import asdict
from typing import Any, TextIO

from events.errors import LedgerError
from projections.backends import open_store
from projections.parallel_rebuild import Job
from projections.projector import project
from projections.stats import ProjectionStats


async def _work(job: Job) -> ProjectionStats:
    """A worker: fold its partitions into its stage, as a sequential rebuild would."""
    store = open_store(job.stage_dsn)
    try:
        store.prepare("rebuild", replace=True)
        store.start_bulk_load()

        def report(records: int, _total: int | None) -> None:
            _say({"records": records})

        return await project(
            job.settings,
            store,
            until=job.until,
            partitions=set(job.until),
            batch_size=job.batch_size,
            progress=report,
            write_in_thread=store.rebuild_writes_in_thread,
        )
    finally:
        store.close()


# The worker's messages to its parent: the original stdout (main() points fd 1 at stderr,
# so that nothing else printed can be taken for a message).
_parent: TextIO = sys.stdout


def _say(message: dict[str, Any]) -> None:
    _parent.write(json.dumps(message) + "\n")
    _parent.flush()


def main() -> None:
    """``python -m projections.rebuild_worker --worker=N``: run the pickled ``Job`` on stdin,
    reporting progress, then stats or one error line, as JSON lines on stdout."""
    data = sys.stdin.buffer.read()
    if not data:
        return  # started ahead, then not needed: fewer shares than workers
    job = pickle.loads(data)  # noqa: S301 (from our parent, over a pipe)
    global _parent
    _parent = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        stats = asyncio.run(_work(job))
    except LedgerError as exc:
        _say({"error": exc.message})
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 (one line for the parent, not a traceback)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        _say({"error": f"{type(exc).__name__}: {first}".rstrip(": ")})
        sys.exit(1)
    _say({"stats": asdict(stats)})


if __name__ == "__main__":
    main()
