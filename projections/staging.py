"""Staging for the parallel rebuild: a staging area per worker beside the projection, built
by that worker alone (projections/parallel_rebuild.py), then merged into the projection in
one transaction. Each backend says where a stage lives (a file beside SQLite's, a schema
in PostgreSQL)."""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Sequence

from projections.database import Database
from projections.schema import PROJECTION_META, TABLES


class Staging(Database):
    """A projection database that can hold, and merge, a parallel rebuild's stages."""

    @abstractmethod
    def open_stage(self, name: str) -> str:
        """Create an empty staging area called ``name`` beside this projection, and return
        a DSN for it: a parallel rebuild's worker builds its share of the tables there
        (projections/parallel_rebuild.py). An old stage of that name is dropped first."""

    @abstractmethod
    def drop_stage(self, name: str) -> None:
        """Remove the staging area ``name``, if it exists."""

    def merge_stages(self, names: Sequence[str]) -> None:
        """Copy every row of the ledger tables of the stages ``names`` (all but
        ``projection_meta``, which ``prepare`` wrote here) into this projection, offsets
        included, in ONE transaction: either all of the rebuild is here or none of it."""
        self._attach_stages(names)
        try:
            self.begin()
            try:
                for name in names:
                    for table in TABLES:
                        if table is PROJECTION_META:
                            continue
                        cols = ", ".join(table.column_names)
                        source = self._stage_table(name, table.name)
                        self._execute(
                            f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {source}"  # noqa: S608
                        )
            except BaseException:
                self.rollback()
                raise
            self.commit()
        finally:
            self._detach_stages(names)

    def _attach_stages(self, names: Sequence[str]) -> None:
        """Make the stages' tables visible to this connection (SQLite attaches files)."""
        return

    def _detach_stages(self, names: Sequence[str]) -> None:
        """Undo ``_attach_stages``."""
        return

    def _stage_table(self, name: str, table: str) -> str:
        """How this connection names ``table`` of stage ``name`` in SQL: an attached
        SQLite database and a PostgreSQL schema are both qualified by the stage's name."""
        return f"{stage_name(name)}.{table}"


def stage_name(name: str) -> str:
    """A stage name usable as an unquoted SQL identifier (and a file suffix)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise ValueError(f"bad stage name {name!r}")
    return name
