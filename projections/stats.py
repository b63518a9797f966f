"""What a projection run reports: its counts, and the progress callback it calls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Called after every committed batch with (records read so far, records to read or None).
ProgressCallback = Callable[[int, int | None], None]


@dataclass
class ProjectionStats:
    """What one ``project`` call did."""

    batches: int = 0
    records: int = 0
    applied: int = 0
    skipped: int = 0
    dead_lettered: int = 0
