"""docs/SETTINGS.md is the table ``python -m config.table`` generates, and lists every
variable, with the old flat name of each one that moved."""

from __future__ import annotations

from config.legacy import MOVED, old_variable
from config.table import TABLE, markdown


def test_the_checked_in_table_is_the_generated_one() -> None:
    assert TABLE.read_text() == markdown(), "stale: run python -m config.table"


def test_every_old_name_is_in_the_table() -> None:
    text = TABLE.read_text()
    for name in MOVED:
        assert f"`{old_variable(name)}` |" in text, name
