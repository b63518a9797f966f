from datetime import UTC, datetime, timedelta
from pathlib import Path

from streams.timers import DueIndex

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_due_entries_in_order_per_partition_and_rescheduling(tmp_path: Path) -> None:
    index = DueIndex(tmp_path / "due")
    try:
        index.schedule(0, "a", T0 + timedelta(seconds=5))
        index.schedule(0, "b", T0 + timedelta(seconds=1))
        index.schedule(1, "c", T0 + timedelta(seconds=2))
        index.schedule(2, "d", T0 + timedelta(seconds=1))
        assert index.due([0, 1], T0, 10) == []
        assert index.due([0, 1], T0 + timedelta(seconds=2), 10) == [(0, "b"), (1, "c")]
        # Rescheduling replaces the key's single entry; None clears it.
        index.schedule(0, "b", T0 + timedelta(seconds=9))
        index.schedule(1, "c", None)
        assert index.due([0, 1, 2], T0 + timedelta(seconds=6), 10) == [(0, "a"), (2, "d")]
        assert index.count() == 3
        assert index.size == 3
        assert index.next_due([0]) == T0 + timedelta(seconds=5)
        assert index.due([0, 1, 2], T0 + timedelta(seconds=60), 1) == [(0, "a")]
        assert index.drop_partition(0) == 2
        assert index.due([0, 1, 2], T0 + timedelta(seconds=60), 10) == [(2, "d")]
        assert index.count() == 1
        assert index.size == 1
    finally:
        index.close()
    assert not (tmp_path / "due").exists()
