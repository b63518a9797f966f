"""The kit's errors, apart from the store protocol so a store implementation
(receiver/postgres.py) raises them without importing the module that opens it."""

from __future__ import annotations


class StoreUnavailable(Exception):
    """The store's database did not answer in time (restarting, unreachable): nothing was
    recorded or read; the kit answers 503 with Retry-After and runs no handler."""
