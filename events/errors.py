"""The one error type meant for a person: one clear line, plus a hint saying what to do.

Raised by every package (a projection that read past the log's end, a broker that does
not answer, a topic that does not exist, a bad setting); the CLI prints it as two lines
and exits 1, never as a traceback.
"""

from __future__ import annotations


class LedgerError(Exception):
    """An error meant for a person at a terminal: ``message`` and a ``hint``."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(LedgerError):
    """Settings that cannot work, found at start: a usage error (exit code 2)."""

    exit_code = 2
