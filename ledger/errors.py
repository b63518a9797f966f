"""The CLI's error type: one clear line, plus a hint saying what to do about it."""

from __future__ import annotations


class LedgerError(Exception):
    """An error meant for a person at a terminal: ``message`` and a ``hint``."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
