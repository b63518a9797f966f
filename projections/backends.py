"""Choosing a backend from a DSN: ``postgresql://...`` or ``sqlite:///path`` (or a path)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from config.settings import Settings
from projections.store import Store


def default_dsn(settings: Settings) -> str:
    """The configured projection database, or the embedded default: a SQLite file in the
    data dir."""
    if settings.projection.dsn:
        return settings.projection.dsn
    return f"sqlite://{(settings.data_dir / 'projections.sqlite3').resolve()}"


def open_store(dsn: str) -> Store:
    """Connect to the projection database the DSN names."""
    if dsn.startswith(("postgresql://", "postgres://")):
        from projections.postgres import PostgresStore

        return PostgresStore(dsn)
    from projections.sqlite import SqliteStore

    path = dsn.removeprefix("sqlite://") if dsn.startswith("sqlite://") else dsn
    return SqliteStore(dsn, Path(path))


@contextmanager
def reading(dsn: str) -> Iterator[Store]:
    """The projection the DSN names, open for reading, closed after."""
    store = open_store(dsn)
    try:
        store.prepare("read")
        yield store
    finally:
        store.close()
