"""Opening a store by URL: SQLite and PostgreSQL URLs, one clear line for anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from receiver import SqliteStore, open_store
from receiver.postgres import PostgresStore
from tests.fixtures.private import readable_by_others
from tests.receiver.support import lease


async def test_store_urls_pick_the_backend_and_a_bad_one_says_what_is_accepted(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite://{tmp_path / 'r.db'}")
    assert isinstance(store, SqliteStore)
    await store.start()
    run = lease()
    await store.admit("k1", 1, run)
    assert await store.complete("k1", "id-1", run.holder)
    await store.close()
    assert (tmp_path / "r.db").exists()
    assert readable_by_others(tmp_path) == []
    # A folder the store creates is owner only too.
    nested = open_store(f"sqlite://{tmp_path / 'kit' / 'data' / 'r.db'}")
    await nested.start()
    await nested.admit("k1", 1, lease())
    await nested.close()
    assert readable_by_others(tmp_path / "kit") == []
    assert isinstance(open_store("postgresql://u@127.0.0.1:1/db"), PostgresStore)
    with pytest.raises(ValueError, match="must start with sqlite:// or postgresql://") as bad:
        open_store("mysql://admin:hunter2@db/receiver")
    assert "hunter2" not in str(bad.value)
